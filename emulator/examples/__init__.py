"""Runnable examples of the Python API (emulator/README.md, "Python API")."""

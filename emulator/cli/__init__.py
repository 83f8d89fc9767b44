"""The `mpft` command line."""

"""Shared test configuration: the integration tier (marker `root`) needs root, Open vSwitch and Mininet."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def _ovs_running() -> bool:
    if not shutil.which("ovs-vsctl"):
        return False
    return subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config, items):
    """Integration tests are skipped, with the reason, only where they cannot run at all."""
    reason = None
    if os.geteuid() != 0:
        reason = "integration tier needs root (run: sudo make test)"
    elif not _ovs_running():
        reason = "integration tier needs Open vSwitch running (run: sudo make setup)"
    if reason:
        for item in items:
            if "root" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))

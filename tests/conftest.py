"""Shared test configuration: the integration tier (marker `root`) needs root, Open vSwitch and Mininet; the
stock-kernel tests (marker `stock_kernel`) need a stock kernel's features, and where MPFT_REQUIRE_STOCK_KERNEL=1
(make vm-check's guest, which must have them all) their skips are failures."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

NEWER_KERNEL = "only on a newer kernel"  # a skip reason saying so is no failure in make vm-check's guest


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and "stock_kernel" in item.keywords and os.environ.get("MPFT_REQUIRE_STOCK_KERNEL") == "1":
        why = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if NEWER_KERNEL in why:  # a feature of kernels newer than the stock one: its skip is right there
            return
        report.outcome = "failed"
        report.longrepr = f"skipped where every stock-kernel feature must be present: {why}"

"""The CPU monitor watches the run's own processes beside the switch daemon: a real process that keeps a core busy
makes the run CPU-bound and is named in the verdict; an idle one does not. No root: it reads /proc."""

from __future__ import annotations

import subprocess
import sys
import time

from emulator.net.monitor import CpuMonitor

SPIN = "import time\nend = time.monotonic() + 4\nwhile time.monotonic() < end:\n    pass\n"
SLEEP = "import time\ntime.sleep(4)\n"


def _watch(code: str) -> tuple[CpuMonitor, subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", code])
    monitor = CpuMonitor(interval=0.5, watch=lambda: {"n0g0 agent": proc.pid, "gone": 2**22 + 7})
    return monitor.start(), proc


def _sample(code: str):
    monitor, proc = _watch(code)
    try:
        time.sleep(2.2)
    finally:
        report = monitor.stop()
        proc.kill()
        proc.wait()
    return report


def test_a_saturated_run_process_makes_the_run_cpu_bound():
    report = _sample(SPIN)
    assert report.samples >= 3
    assert report.busiest_process == "n0g0 agent" and report.max_process > 0.9
    assert report.cpu_bound
    assert report.verdict_for("x-seed1").startswith("CPU-BOUND in x-seed1")
    assert "busiest run process n0g0 agent" in report.detail()
    assert all(len(point) == 4 for point in report.series)


def test_an_idle_run_process_does_not():
    report = _sample(SLEEP)
    assert report.samples >= 3 and report.max_process < 0.2

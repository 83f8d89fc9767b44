"""The CPU monitor watches the run's own processes and its switch daemons: a real process that keeps a core busy
makes the run CPU-bound and is named in the verdict; an idle one does not. No root: it reads /proc."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from emulator.analysis.fidelity import cpu_bound, cpu_verdict
from emulator.net.monitor import SEND_ERROR, CpuMonitor, VswitchdLog

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
    assert cpu_bound(report)
    assert cpu_verdict("x-seed1", report).startswith("CPU-BOUND in x-seed1")
    assert "busiest run process n0g0 agent" in report.detail()
    assert all(len(point) == 4 for point in report.series)


def test_an_idle_run_process_does_not():
    report = _sample(SLEEP)
    assert report.samples >= 3 and report.max_process < 0.2


def test_a_saturated_switch_daemon_makes_the_run_cpu_bound_and_is_named():
    """Any of the run's switch daemons counts, not only the machine's own ovs-vswitchd."""
    busy, idle = (subprocess.Popen([sys.executable, "-c", code]) for code in (SPIN, SLEEP))
    monitor = CpuMonitor(interval=0.5, switches=lambda: {"ovs-vswitchd p0": idle.pid, "ovs-vswitchd p1": busy.pid})
    try:
        monitor.start()
        time.sleep(2.2)
    finally:
        report = monitor.stop()
        for proc in (busy, idle):
            proc.kill()
            proc.wait()
    assert report.max_thread > 0.9 and report.busiest_thread.startswith("ovs-vswitchd p1 ")
    assert cpu_bound(report)


def _wait_for_exec(procs: list[subprocess.Popen], argument: str) -> None:
    """Until each child runs its own command line (a daemon found by the monitor is long started; a child just
    forked may still show its parent's)."""
    give_up = time.monotonic() + 10
    for p in procs:
        while argument.encode() not in Path(f"/proc/{p.pid}/cmdline").read_bytes():
            assert time.monotonic() < give_up, "the child did not start"
            time.sleep(0.01)


def test_send_errors_are_counted_in_every_daemons_log_from_the_start(tmp_path):
    """Each daemon's log is found from its --log-file argument; errors logged before start() do not count."""
    logs = [tmp_path / "p0.log", tmp_path / "p1.log"]
    logs[0].write_text(f"old: {SEND_ERROR}\n")
    logs[1].write_text("")
    daemons = [subprocess.Popen([sys.executable, "-c", SLEEP, f"--log-file={log}"]) for log in logs]
    try:
        _wait_for_exec(daemons, "--log-file=")
        counter = VswitchdLog([d.pid for d in daemons]).start()
        with open(logs[0], "a") as log:
            log.write(f"new: {SEND_ERROR}\n")
        with open(logs[1], "a") as log:
            log.write(f"{SEND_ERROR}\n{SEND_ERROR}\nsomething else\n")
        assert counter.send_errors() == 3
    finally:
        for d in daemons:
            d.kill()
            d.wait()

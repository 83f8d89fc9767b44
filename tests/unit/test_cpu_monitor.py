"""The CPU monitor watches the run's own processes and its switch daemons: a real process that keeps a core busy
makes the run CPU-bound and is named in the verdict; an idle one does not. Other work that keeps the machine busy
at a lower priority leaves a light run free, not a saturated one. No root: it reads /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from emulator.analysis.fidelity import IDLE_FLOOR, cpu_bound, cpu_verdict
from emulator.net.monitor import SEND_ERROR, CpuMonitor, Ticks, VswitchdLog, _busiest
from emulator.net.priority import autogroups, rank

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
    assert report.busiest_process == "n0g0 agent" and 0.9 < report.max_process <= 1.05  # one thread: a core at most
    assert cpu_bound(report)
    assert cpu_verdict("x-seed1", report).startswith("CPU-BOUND in x-seed1")
    assert "busiest run process n0g0 agent" in report.detail()
    assert all(len(point) == 5 for point in report.series)


def test_a_threads_share_is_of_the_time_between_its_own_readings():
    """A reading made late (behind busier threads) covers a longer time than the sampler's interval."""
    on_time, late = Ticks(10.0, {"t": 0, "u": 0}), Ticks(11.5, {"t": 75, "u": 30})
    assert _busiest(on_time, late) == ("t", 0.5)
    assert _busiest(on_time, Ticks(11.0, {"t": 144})) == ("t", 1.0)  # accounted late: a thread has one core


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


def _other_work(nice: int) -> list[subprocess.Popen]:
    """A busy loop per core, each in a session of its own (as another user's work) at `nice`, its group's too
    where the kernel groups sessions."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True, preexec_fn=lambda: os.nice(nice))
             for _ in range(os.cpu_count() or 1)]
    for p in procs:
        if autogroups() and nice:
            Path(f"/proc/{p.pid}/autogroup").write_text(str(nice))
        assert rank(p.pid, nice) == nice
    return procs


def _beside(other_nice: int, run_code: str, run_processes: int = 1):
    """What the monitor says of `run_processes` running `run_code` (the run, at our priority) beside other work."""
    other = _other_work(other_nice)
    run = [subprocess.Popen([sys.executable, "-c", run_code]) for _ in range(run_processes)]
    monitor = CpuMonitor(interval=0.5, watch=lambda: {f"agent {i}": p.pid for i, p in enumerate(run)}, switches=dict)
    try:
        monitor.start()
        time.sleep(2.2)
    finally:
        report = monitor.stop()
        for proc in other + run:
            proc.kill()
            proc.wait()
    return report


def test_other_work_below_the_runs_priority_leaves_a_light_run_free():
    """A busy machine is not a saturated run: what yields to the run's processes was theirs to take."""
    report = _beside(19, SLEEP)
    assert report.min_idle < IDLE_FLOOR  # the machine was busy (beside other work, too: a core at least),
    assert report.max_other > 0.3 and report.min_free > report.min_idle + 0.3  # with work the run could have had
    assert not cpu_bound(report)
    assert "other work at a lower priority took up to" in report.detail()


def test_a_saturated_run_beside_work_below_its_priority_is_still_cpu_bound():
    """More busy run processes than cores, each under a core: only the machine's share tells it is saturated."""
    report = _beside(19, SPIN, (os.cpu_count() or 1) + 1)
    assert report.max_process < 0.9
    assert report.min_free < IDLE_FLOOR and cpu_bound(report)


def test_other_work_at_the_runs_priority_is_not_free():
    report = _beside(0, SLEEP)
    assert report.max_other < 0.05 and report.min_free < IDLE_FLOOR and cpu_bound(report)


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

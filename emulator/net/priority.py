"""Where the network's processes stand in the machine's scheduler. The switch daemons and the controller run at
NETWORK_NICE (as ovs-ctl starts the machine's own ovs-vswitchd) and the agents realtime, so work that is not the
run's, at a normal priority, yields them the CPU: the CPU monitor counts what such work took as free for the run.
Where the kernel groups each session's processes (autogroup), a process competes with other sessions at its
group's nice, not its own: set_group_nice() sets the group's, and rank() reads the one that counts."""

from __future__ import annotations

import functools
from pathlib import Path

NETWORK_NICE = -10
YIELD_NICE = 10  # nice levels below a process at which other work yields it about 90 % of a core it wants


@functools.cache
def autogroups() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


def group_nice(pid: int) -> int | None:
    """The nice of the session group a process competes with other sessions in (None: the kernel groups none)."""
    if not autogroups():
        return None
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def set_group_nice(pid: int, nice: int) -> None:
    """The nice a process's session group competes with other sessions at (where the kernel groups sessions)."""
    if autogroups():
        try:
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
        except OSError:  # gone, or in a cgroup of its own: the process's nice is what counts then
            pass


def rank(pid: int, nice: int) -> int:
    """The nice a process (whose own is `nice`) competes with other sessions' processes at."""
    group = group_nice(pid)
    return nice if group is None else group

"""How agent processes start together with the runner, and one event loop serving many hosts' agents.

Start: each agent writes `<host>.ready` once its sockets are bound, then waits for the runner's `go` file, which
holds the common start time on CLOCK_MONOTONIC (shared by every namespace of the machine).

The loop: one process serves several hosts (one per CPU core by default, instead of one per host), so the
machine's CPU goes to the switches, not to waking sixteen interpreters. Every host's receive socket is in one
epoll set, every host's next wake-up time in one timer heap; a host is stepped when its socket is readable or its
time has come, so a wake-up costs one system call for all hosts and no host is visited without work. Sockets are
non-blocking: a full send queue is a send error the transport recovers from, and never stalls the other hosts.
"""

from __future__ import annotations

import heapq
import math
import os
import select
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from traffic.kernel import WakeTimer

IDLE_WAIT_S = 0.05  # the loop looks at its stop flag and the deadline at least this often


class Selectable(Protocol):
    def fileno(self) -> int: ...


class Sample(Protocol):
    def add(self, value: float) -> None: ...


class Steppable(Protocol):
    """What the loop needs from an agent."""
    @property
    def host(self) -> str: ...

    @property
    def rx(self) -> Selectable: ...  # the receive socket

    @property
    def lateness(self) -> Sample: ...  # add(us) for how late a timer wake-up came

    def start(self, t0: int) -> None: ...

    def step(self, now: int, readable: bool) -> float: ...


def on_stop_signals(stop) -> None:
    """SIGTERM (the runner's) and SIGINT call `stop()`: the agent finishes its loop and writes its results."""
    signal.signal(signal.SIGTERM, lambda _sig, _frame: stop())
    signal.signal(signal.SIGINT, lambda _sig, _frame: stop())


def schedule(policy: str) -> str:
    """Run this process as `policy` says (realtime: SCHED_FIFO at the lowest priority, not inherited by children);
    the policy it got: normal where the kernel refuses (no privilege)."""
    if policy == "realtime":
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(1))
            return "realtime"
        except PermissionError:
            pass
    return "normal"


def cpu_now() -> tuple[os.times_result, float]:
    return os.times(), time.process_time()


def cpu_since(then: tuple[os.times_result, float]) -> dict[str, float]:
    """This process's CPU seconds since `then` (a cpu_now()): the exact total, and its user and system parts
    (sampled by the kernel's tick). This kernel charges the veth and HTB work done inside sendto to the sender,
    so the two parts tell the agent's own work from the network's."""
    times, total = cpu_now()
    return {"user_s": times.user - then[0].user, "system_s": times.system - then[0].system,
            "total_s": total - then[1]}


def wait_for_go(agents: Sequence, rundir: Path, timeout_s: float, stopped) -> int:
    """Say `<host>.ready` for each agent, wait for the runner's `go` (or `stopped()`, or the timeout); record on
    each agent the CPU times at the start (`cpu_at_go`: the traffic's CPU, not the start-up's). The start time."""
    for a in agents:
        (rundir / f"{a.host}.ready").write_text("")
    go = rundir / "go"
    give_up = time.monotonic() + timeout_s
    while not go.exists() and not stopped() and time.monotonic() < give_up:
        time.sleep(0.01)
    at_go = cpu_now()
    for a in agents:
        a.cpu_at_go = at_go
    return int(go.read_text()) if go.exists() else time.monotonic_ns()


class Loop:
    """Step agents when their socket is readable or their wake-up time has come, until stopped or the deadline.
    A wake-up also steps the agents due within `slack_ns` after it (their own slack lets them do that work early),
    so one wake-up serves several; a wake time an agent gives back within its slack is work it does not do early
    (a message's post time), and waits for its time."""

    def __init__(self, agents: Sequence[Steppable], slack_ns: float = 0.0) -> None:
        self.agents = agents
        self.slack_ns = slack_ns
        self.stop = False
        self.wakeups = 0  # returns from epoll: the machine charges each one a fixed cost (benchmarks/agents.py)

    def run(self, rundir: Path, ready_timeout_s: float, deadline_s: float) -> None:
        t0 = wait_for_go(self.agents, rundir, ready_timeout_s, lambda: self.stop)
        deadline = t0 + deadline_s * 1e9
        poller = select.epoll()
        timer = WakeTimer()
        poller.register(timer.fd, select.EPOLLIN)
        by_fd = {}  # receive socket -> agent index
        for i, a in enumerate(self.agents):
            a.start(t0)
            by_fd[a.rx.fileno()] = i
            poller.register(a.rx.fileno(), select.EPOLLIN)
        wake = [float(t0)] * len(self.agents)  # each agent's current wake-up time (-1: taken from the heap)
        strict = [True] * len(self.agents)  # its wake-up time is work it does not do early
        heap = [(float(t0), i) for i in range(len(self.agents))]  # (time, index); stale entries are skipped
        slack = self.slack_ns
        try:
            while not self.stop:
                now = time.monotonic_ns()
                if now >= deadline:
                    break
                while heap and wake[heap[0][1]] != heap[0][0]:
                    heapq.heappop(heap)  # superseded (the agent was stepped since): no wake-up for it
                if heap and heap[0][0] <= now + (0 if strict[heap[0][1]] else slack):
                    ready = poller.poll(0)
                else:
                    timer.set(int(heap[0][0]) if heap and heap[0][0] - now < IDLE_WAIT_S * 1e9 else 0)
                    ready = poller.poll(IDLE_WAIT_S)
                self.wakeups += 1
                readable = {by_fd[fd] for fd, _ in ready if fd != timer.fd}
                now = time.monotonic_ns()
                due, wait = set(), []
                while heap and heap[0][0] <= now + slack:
                    when, i = heapq.heappop(heap)
                    if wake[i] != when:
                        continue
                    if when > now and strict[i]:
                        wait.append((when, i))
                        continue
                    wake[i] = -1.0  # taken
                    due.add(i)
                    if i not in readable:  # woken by its timer (or served early): how late?
                        self.agents[i].lateness.add(max(0.0, now - when) / 1e3)
                for entry in wait:
                    heapq.heappush(heap, entry)
                for i in due | readable:
                    stepped = time.monotonic_ns()
                    # a wake-up time already past (say, a message its dependencies just released) means now
                    when = max(float(self.agents[i].step(stepped, i in readable)), float(stepped))
                    if when != wake[i] and when != math.inf:
                        heapq.heappush(heap, (when, i))
                    wake[i] = when
                    strict[i] = when <= stepped + slack
        finally:
            poller.close()
            timer.close()

"""The shared event loop without root: real UDP sockets on loopback, hosts that ask to be woken at set times, the
runner's go file; how the runner splits hosts over agent processes, and how long it waits for them to start."""

from __future__ import annotations

import math
import random
import socket
import threading
import time
from pathlib import Path

from emulator.run.launch import _wait_for, agent_groups
from traffic.cc import PLUGINS
from traffic.eventloop import Loop
from traffic.plan import Sampler

MS = 1_000_000


class Host:
    """Wakes itself every `period_ns` until `stop_after` steps; records why each step came."""

    def __init__(self, name: str, period_ns: float = math.inf, stop_after: int = 10 ** 9) -> None:
        self.host = name
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.bind(("127.0.0.1", 0))
        self.rx.setblocking(False)
        self.lateness = Sampler(1000, random.Random(0))
        self.period_ns, self.stop_after = period_ns, stop_after
        self.steps: list[tuple[int, bool]] = []
        self.got: list[bytes] = []

    def start(self, t0: int) -> None:
        self.t0 = t0

    def step(self, now: int, readable: bool) -> float:
        self.steps.append((now, readable))
        if readable:
            while True:
                try:
                    self.got.append(self.rx.recv(100))
                except BlockingIOError:
                    break
        if len(self.steps) >= self.stop_after:
            return math.inf
        return self.t0 + len(self.steps) * self.period_ns


def _go(rundir: Path, delay_s: float = 0.02) -> int:
    t0 = time.monotonic_ns() + int(delay_s * 1e9)
    (rundir / "go").write_text(str(t0))
    return t0


def test_hosts_are_woken_at_their_times_and_when_their_socket_is_readable(tmp_path):
    timed, listening = Host("a", period_ns=5 * MS, stop_after=8), Host("b")
    loop = Loop([timed, listening])
    t0 = _go(tmp_path)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def later() -> None:
        time.sleep(0.08)
        sender.sendto(b"hello", listening.rx.getsockname())
        time.sleep(0.05)
        loop.stop = True
    threading.Thread(target=later).start()
    loop.run(tmp_path, ready_timeout_s=5, deadline_s=5)
    assert (tmp_path / "a.ready").exists() and (tmp_path / "b.ready").exists()
    assert len(timed.steps) == 8  # then it asked for no more wake-ups
    for i, (now, readable) in enumerate(timed.steps):
        assert now >= t0 + i * 5 * MS and not readable  # never early
    assert timed.lateness.seen == 8
    assert listening.got == [b"hello"]
    assert [r for _, r in listening.steps].count(True) == 1  # woken by its socket, once
    assert listening.lateness.seen == 1  # its one timed step: the start
    sender.close()


class Waiting(Host):
    """Asks to be woken 20 ms after every step: a packet every 5 ms keeps putting its wake-up off."""

    def step(self, now: int, readable: bool) -> float:
        super().step(now, readable)
        return now + 20 * MS


def test_a_wake_up_put_off_does_not_wake_the_loop(tmp_path):
    host = Waiting("a")
    loop = Loop([host])
    _go(tmp_path)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def packets() -> None:
        time.sleep(0.03)
        for _ in range(20):
            sender.sendto(b"x", host.rx.getsockname())
            time.sleep(0.005)
        loop.stop = True
    threading.Thread(target=packets).start()
    loop.run(tmp_path, ready_timeout_s=5, deadline_s=5)
    sender.close()
    assert len(host.got) == 20
    assert loop.wakeups <= len(host.steps) + 2, (loop.wakeups, host.steps)  # each stepped it, but the last


def test_the_deadline_ends_the_loop(tmp_path):
    busy = Host("a", period_ns=1 * MS)
    loop = Loop([busy])
    t0 = _go(tmp_path, 0.0)
    loop.run(tmp_path, ready_timeout_s=5, deadline_s=0.05)
    assert time.monotonic_ns() - t0 >= 50 * MS
    assert 10 <= len(busy.steps) <= 51


def test_a_stopped_loop_does_not_wait_for_go(tmp_path):
    loop = Loop([Host("a")])
    loop.stop = True
    started = time.monotonic()
    loop.run(tmp_path, ready_timeout_s=30, deadline_s=30)
    assert time.monotonic() - started < 1


def test_hosts_are_split_into_contiguous_groups():
    hosts = [f"h{i}" for i in range(16)]
    assert agent_groups(hosts, 2) == [hosts[:8], hosts[8:]]
    assert agent_groups(hosts, 16) == [[h] for h in hosts]
    assert agent_groups(hosts, 100) == [[h] for h in hosts]  # no empty process
    three = agent_groups(hosts, 3)
    assert sum(three, []) == hosts and {len(g) for g in three} <= {5, 6}
    assert len(agent_groups(hosts, 0)) >= 1  # one per core
    assert agent_groups(["a"], 4) == [["a"]]


def test_dcqcn_asks_to_be_ticked_only_after_a_notification():
    cc = PLUGINS["ecn"](10e6, 12_000)
    assert cc.next_tick_ns() == math.inf and PLUGINS["none"](10e6, 12_000).next_tick_ns() == math.inf
    cc.on_cnp(1_000)
    assert cc.next_tick_ns() == 1_000 + cc.period_ns
    cc.tick(int(cc.next_tick_ns()))
    assert cc.next_tick_ns() > 1_000 + cc.period_ns


class Released(Host):
    """Asks, once, for a wake-up time already past (as when a message's dependencies complete)."""

    def step(self, now: int, readable: bool) -> float:
        super().step(now, readable)
        return now - 10 ** 9 if len(self.steps) == 1 else math.inf


def test_a_wake_up_time_already_past_is_taken_at_once_and_not_counted_late(tmp_path):
    host = Released("a")
    loop = Loop([host])
    _go(tmp_path, 0.0)
    threading.Timer(0.1, lambda: setattr(loop, "stop", True)).start()
    loop.run(tmp_path, ready_timeout_s=5, deadline_s=5)
    assert len(host.steps) == 2
    assert host.steps[1][0] - host.steps[0][0] < 50 * MS
    assert max(host.lateness.items) < 50_000  # microseconds: not the second in the past it asked for


class Offset(Host):
    """Wakes every 10 ms from its own offset; a host that can do its work early (its wake-up is not strict)."""

    def __init__(self, name: str, offset_ns: int) -> None:
        super().__init__(name, stop_after=6)
        self.offset_ns = offset_ns

    def step(self, now: int, readable: bool) -> float:
        super().step(now, readable)
        return math.inf if len(self.steps) >= self.stop_after else self.t0 + self.offset_ns + len(self.steps) * 10 * MS


def test_hosts_due_within_the_slack_share_a_wake_up(tmp_path):
    for slack, shared in ((0, False), (3 * MS, True)):
        first, second = Offset("a", 0), Offset("b", 2 * MS)
        loop = Loop([first, second], slack_ns=slack)
        _go(tmp_path)
        loop.run(tmp_path, ready_timeout_s=5, deadline_s=0.1)
        assert len(first.steps) == len(second.steps) == 6
        together = sum(abs(a - b) < MS for (a, _), (b, _) in zip(first.steps[1:], second.steps[1:], strict=True))
        assert (together == 5) == shared, (slack, first.steps, second.steps)
        # never more than the slack early
        assert all(now >= second.t0 + 2 * MS + i * 10 * MS - slack for i, (now, _) in enumerate(second.steps[1:], 1))
        assert loop.wakeups <= (7 if shared else 13), loop.wakeups


class Strict(Host):
    """Its work comes at exact times (a message's post time): stepped early, it hands back the same time."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.due = [0] + [int(t * MS) for t in (5, 10, 15)]

    def step(self, now: int, readable: bool) -> float:
        super().step(now, readable)
        while self.due and now >= self.t0 + self.due[0]:
            self.due.pop(0)
        return self.t0 + self.due[0] if self.due else math.inf


def test_a_wake_up_handed_back_within_the_slack_waits_for_its_time(tmp_path):
    host, neighbour = Strict("a"), Offset("b", 4 * MS)  # the neighbour wakes the loop 1 ms before each time
    loop = Loop([host, neighbour], slack_ns=2 * MS)
    t0 = _go(tmp_path)
    loop.run(tmp_path, ready_timeout_s=5, deadline_s=0.05)
    assert not host.due
    early = [now for now, _ in host.steps if any(0 < t0 + t * MS - now < 2 * MS for t in (5, 10, 15))]
    assert 1 <= len(early) <= 3, host.steps  # stepped early in the neighbour's wake-ups, then not again
    assert len(host.steps) <= 8, host.steps  # no spinning until its time
    assert host.steps[-1][0] >= t0 + 15 * MS


class Staggered:
    """Agents that become ready at set times after it is made (s; inf: never), as a launcher reports them."""

    def __init__(self, ready_at: dict[str, float]) -> None:
        self.ready_at, self.t0 = ready_at, time.monotonic()

    def status(self, what: str) -> tuple[list[str], bool]:
        return [h for h, t in self.ready_at.items() if t > time.monotonic() - self.t0], False


def test_the_runner_waits_for_agents_that_keep_becoming_ready_and_gives_up_once_they_stop():
    """Each agent ready within the stall of the one before: all are waited for, though the last comes after more
    than the stall; one that never comes is given up on a stall after the last that did, not at the deadline."""
    assert _wait_for([Staggered({"a": 0.1, "b": 0.3, "c": 0.5})], 3, "ready", 30, "", True, stall_s=0.25) == ([], False)
    started = time.monotonic()
    missing = _wait_for([Staggered({"a": 0.1, "b": 0.3, "d": math.inf})], 3, "ready", 30, "", True, stall_s=0.25)
    assert missing == (["d"], False)
    assert time.monotonic() - started < 10

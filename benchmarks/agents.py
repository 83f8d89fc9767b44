"""Agent CPU per packet event (a data packet or an ACK, sent or received), user and system time separately, on
the sender and on the receiver side: the figure the agents' budget is judged by, for the agents' hot path as
source and as compiled by mypyc (traffic.hotpath), side by side.

On the 16-host leaf-spine (4 leaves x 4 hosts, 4 spines, 10 Mbit/s), the hosts of leaves 0-1 each send to one
host of leaves 2-3 (so senders only send and receivers only receive), 2 MB per pair split over 1 or 15 queue
pairs, window 2, no ACK coalescing, no congestion control (cc none: the issue's conditions; the default, pull,
adds grants and requests, and the wake-ups they cost, to the same packet events). Each agent's CPU is counted
from the common start (its start-up left out); the run's fidelity verdict, completion / lower bound and the
agents' timer lateness are printed beside it. The hosts' agents share one process per CPU core (senders in one,
receivers in the other).

User and system time are sampled by the kernel's tick; the exact total (CLOCK_PROCESS_CPUTIME_ID) is printed
too, with the wake-ups (returns from epoll) per event and the machine's floor: the CPU that a process doing nothing
but sleep on a timerfd and wake up is charged per wake-up at the same interval, measured here in the same run
(on a virtual machine the host's interrupt and idle-exit work lands there). A process that wakes once per event
cannot cost less than that floor per event, whatever its code.

Then issue 14's all-to-all on the same fabric (every host sends 250 kB to each of the 15 others, window 2) under
ecmp, spray and adaptive, cc none: with one agent process per core, compiled and from source; with one per host
from source (the earlier design); compiled with ACKs coalesced in pairs; and compiled under the default cc (pull)
with the window left to it; completion / bound, the agents' share of the machine's CPU, timer lateness, verdict.

    sudo .venv/bin/python benchmarks/agents.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import tempfile
import time
from pathlib import Path

from results import median_range, recorded

from emulator.analysis import bounds
from emulator.model import topologies
from emulator.model.schedule import Message
from emulator.run.job import run_job
from traffic import hotpath
from traffic.contract import HostResult
from traffic.kernel import WakeTimer
from traffic.options import TransportOptions

OUT = Path(tempfile.mkdtemp(prefix="mpft-bench-agents-"))
PAIR_BYTES = 2_000_000
TARGET_US = {1: 12.0, 15: 17.0}  # issue 14: user + system per event, ACK coalescing off
A2A_BYTES = 250_000
CORES = os.cpu_count() or 1
SLACK = TransportOptions.wake_slack  # the default; 0 is the agent that does each thing exactly on time
# the all-to-all's configurations: agent processes (0: one per core), code, ACK every, cc, wake slack
A2A_CONFIGS = ((0, "compiled", 1, "none", SLACK), (0, "compiled", 1, "none", 0.0), (0, "python", 1, "none", SLACK),
               (16, "python", 1, "none", SLACK), (0, "compiled", 2, "none", SLACK), (0, "compiled", 1, "pull", SLACK))


def schedule(hosts: list[str], qps: int) -> list[Message]:
    half = len(hosts) // 2
    pairs = list(zip(hosts[:half], hosts[half:], strict=True))
    return [Message(i * qps + q, 0.0, src, dst, PAIR_BYTES // qps, qp=q + 1)
            for i, (src, dst) in enumerate(pairs) for q in range(qps)]


def wakeup_floor_us(interval_s: float, wakeups: int = 300) -> float:
    """CPU microseconds this machine charges a process per wake-up when all it does is sleep `interval_s` on a
    timerfd in epoll (as the agents' loop does) and wake."""
    timer, poller = WakeTimer(), select.epoll()
    poller.register(timer.fd, select.EPOLLIN)
    try:
        start = time.process_time()
        for _ in range(wakeups):
            timer.set(time.monotonic_ns() + int(interval_s * 1e9))
            poller.poll(1.0)
            os.read(timer.fd, 8)
        return (time.process_time() - start) / wakeups * 1e6
    finally:
        poller.close()
        timer.close()


def per_event(agents: list[HostResult], side: str, duration_s: float) -> dict:
    """Microseconds per packet event over one side's agents (a process may serve several: counted once): user,
    system, the exact total; wake-ups per event, and the machine's floor per event at this side's wake-up rate."""
    events = max(1, sum(a.tx.data_packets + a.acks.received if side == "sender" else a.rx.packets + a.acks.sent
                        for a in agents))
    procs = {a.pid: a for a in agents}
    cpu = [a.traffic_cpu_s for a in procs.values()]
    wakeups = sum(a.wakeups for a in procs.values())
    floor = wakeup_floor_us(duration_s * len(procs) / max(1, wakeups))
    us = {"user": sum(c.user_s for c in cpu) / events * 1e6, "system": sum(c.system_s for c in cpu) / events * 1e6,
          "total": sum(c.total_s for c in cpu) / events * 1e6}
    return {**us, "wakeups": wakeups / events, "floor": floor * wakeups / events}


def one_run(qps: int, seed: int, code: str, slack: float) -> dict:
    fabric = topologies.build("ft2", leaves=4, hosts_per_leaf=4, spines=4)
    hosts = fabric.hosts()
    messages = schedule(hosts, qps)
    rundir = OUT / f"qp{qps}-{code}-slack{slack}-seed{seed}"
    m = run_job(fabric, messages, rundir, app="ecmp", seed=seed, quiet=True,
                options=TransportOptions(cc="none", window=2, agent_code=code, wake_slack=slack))
    assert m.agent_code == code, m.agent_code
    agents = {h: HostResult.read(rundir / f"{h}.json") for h in hosts}
    half = len(hosts) // 2
    sender = per_event([agents[h] for h in hosts[:half]], "sender", m.completion_s or 1.0)
    receiver = per_event([agents[h] for h in hosts[half:]], "receiver", m.completion_s or 1.0)
    bound = bounds.lower_bound_s(fabric, messages)
    return {"sender": sender, "receiver": receiver, "lost": m.lost_messages, "cpu_bound": m.fidelity.cpu_bound,
            "ratio": m.completion_s / bound if m.completion_s else None,
            "lateness_ms": m.fidelity.timer_lateness_us_p99 / 1e3,
            "retransmits": m.packets.retransmits / max(1, m.packets.data)}


def alltoall(app: str, seed: int, processes: int, code: str, ack_every: int = 1, cc: str = "none",
             slack: float = SLACK) -> dict:
    """Issue 14's all-to-all: every host of the same fabric sends 250 kB to each of the other 15 at once (window 2;
    under another cc, the window it is given by the fabric)."""
    fabric = topologies.build("ft2", leaves=4, hosts_per_leaf=4, spines=4)
    hosts = fabric.hosts()
    messages = [Message(i, 0.0, src, dst, A2A_BYTES) for i, (src, dst) in
                enumerate((s, d) for s in hosts for d in hosts if s != d)]
    rundir = OUT / f"a2a-{app}-{processes}-{code}-ack{ack_every}-{cc}-slack{slack}-seed{seed}"
    m = run_job(fabric, messages, rundir, app=app, seed=seed, quiet=True,
                options=TransportOptions(cc=cc, window=2 if cc == "none" else 0, agent_processes=processes,
                                         entropy="spray" if app == "spray" else "fixed", ack_every=ack_every,
                                         agent_code=code, wake_slack=slack))
    assert m.agent_code == code, m.agent_code
    f = m.fidelity
    return {"cpu_bound": f.cpu_bound, "lost": m.lost_messages, "lateness_ms": f.timer_lateness_us_p99 / 1e3,
            "agents_share": f.agents_cpu_s / (m.completion_s * CORES) if m.completion_s else None,
            "ratio": m.completion_s / bounds.lower_bound_s(fabric, messages) if m.completion_s else None,
            "retransmits": m.packets.retransmits / max(1, m.packets.data), "idle": f.cpu_idle}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    if hotpath.current() is None:
        raise SystemExit("no current build of the agents' hot path: run make setup first")
    seeds = range(1, args.seeds + 1)
    print("agent CPU per packet event, microseconds: median (range) over seeds; 8 senders -> 8 receivers, window 2; "
          "user and system by the kernel's tick, total exact; floor: the machine's charge for the wake-ups alone")
    print(f"{'QPs':>4} {'code':>8} {'slack':>5} {'side':>8} {'user':>17} {'system':>17} {'total':>17} {'wake-ups':>8} "
          f"{'floor':>6} {'target':>6}  completion/bound  retx  timers p99  CPU-bound runs")
    for qps in (1, 15):
        for code, slack in (("python", SLACK), ("compiled", SLACK), ("compiled", 0.0)):
            runs = [one_run(qps, seed, code, slack) for seed in seeds]
            assert all(r["lost"] == 0 for r in runs), runs
            for side in ("sender", "receiver"):
                col = {k: median_range([r[side][k] for r in runs]) for k in ("user", "system", "total")}
                print(f"{qps:>4} {code:>8} {slack:>5} {side:>8} {col['user']:>17} {col['system']:>17} "
                      f"{col['total']:>17} "
                      f"{statistics.median(r[side]['wakeups'] for r in runs):8.2f} "
                      f"{statistics.median(r[side]['floor'] for r in runs):6.1f} {TARGET_US[qps]:>6.0f}  "
                      f"{statistics.median(r['ratio'] for r in runs):16.2f}  "
                      f"{statistics.median(r['retransmits'] for r in runs):4.0%}  "
                      f"{statistics.median(r['lateness_ms'] for r in runs):7.1f} ms  "
                      f"{sum(r['cpu_bound'] for r in runs)} of {len(runs)}")
    print("\nthe 16-host all-to-all (250 kB to each of the 15 others; cc none: window 2): median (range) over seeds; "
          "agents' CPU as a share of the machine's over the run")
    print(f"{'app':>8} {'cc':>4} {'agent processes':>16} {'code':>8} {'slack':>5} {'ACK every':>9} "
          f"{'completion/bound':>18} {'retx':>5} {'agents CPU':>18} {'timers p99 ms':>16} {'idle':>5}  CPU-bound runs")
    for app in ("ecmp", "spray", "adaptive"):
        for processes, code, ack_every, cc, slack in A2A_CONFIGS:
            runs = [alltoall(app, seed, processes, code, ack_every, cc, slack) for seed in seeds]
            assert all(r["lost"] == 0 for r in runs), runs
            label = "one per core" if processes == 0 else "one per host"
            print(f"{app:>8} {cc:>4} {label:>16} {code:>8} {slack:>5} {ack_every:>9} "
                  f"{median_range([r['ratio'] for r in runs]):>18} "
                  f"{statistics.median(r['retransmits'] for r in runs):5.0%} "
                  f"{median_range([100 * r['agents_share'] for r in runs]):>17}% "
                  f"{median_range([r['lateness_ms'] for r in runs]):>16} "
                  f"{min(r['idle'] for r in runs):5.0%}  {sum(r['cpu_bound'] for r in runs)} of {len(runs)}")
    print(f"(run directories under {OUT})")


if __name__ == "__main__":
    with recorded("agents"):
        main()

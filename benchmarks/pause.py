"""How fast lossless links pause and resume, judged from the frames on the wire (emulator.analysis.reaction),
on the 16-host leaf-spine of benchmarks/congestion.py (10 Mbit/s, MTU 9000) with 256 KiB queues: an incast
15 -> 1, cc none, four packets in flight per queue pair, a 2 s least timeout. Every port of the receiver's leaf is
captured (kernel time stamps); the receiver's downlink backlog is what arrived for it less what it sent, and at
each XOFF crossing every feeder that was sending (three hosts, four spines) is timed to its last frame before it
fell silent, and from the XON crossing to its next frame. Beside it, per run: completion / lower bound, drops,
retransmissions, the pause thread's own reaction figures and the CPU verdict; and the same incast lossy. Last,
PFC's priorities: 14 of the senders in class 1 and the receiver's leaf neighbour in class 0, lossless with one
FIFO per port against a queue (and pauses) per class: how long the class-0 flow takes against its equal share of
the receiver's link, and whether any class-0 queue was paused; the captures are timed for that run's class 1 too
(its frames alone, told by their IP precedence).

    sudo .venv/bin/python benchmarks/pause.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import collections
import csv
import statistics
import tempfile
from pathlib import Path

from results import median_range, recorded

from emulator.analysis import bounds, reaction
from emulator.model import topologies, wire
from emulator.model.schedule import Message
from emulator.net import features
from emulator.net.emulation import Emulation
from emulator.net.sniff import Sniffer
from emulator.run.job import run_job
from emulator.run.launch import transfer
from traffic.options import TransportOptions

OUT = Path(tempfile.mkdtemp(prefix="mpft-bench-pause-"))
OPTIONS = TransportOptions(cc="none", window=4, min_rto_ms=2000)


def fabric(lossless: bool, queueing: str = "fifo"):
    return topologies.build("ft2", leaves=4, hosts_per_leaf=4, spines=4, queue_kb=256, lossless=lossless,
                            queueing=queueing)


def incast(f) -> list[Message]:
    hosts = f.hosts()
    return [Message(i, 0.0, s, hosts[0], 512 * 1024) for i, s in enumerate(hosts[1:])]


def priorities(f) -> list[Message]:
    """The incast's 14 senders in class 1, and one flow in class 0 from the receiver's leaf neighbour."""
    hosts = f.hosts()
    messages = [Message(i, 0.0, s, hosts[0], 512 * 1024, tclass=1) for i, s in enumerate(hosts[2:])]
    return [*messages, Message(len(messages), 0.0, hosts[1], hosts[0], 512 * 1024, tclass=0)]


def captured(seed: int, queueing: str = "fifo") -> tuple[reaction.Reaction, float, int]:
    """The reaction from captures of one lossless run, its packet time (ns) and the port's queue limit. Queueing
    per class, the priorities run: class 1's queue and frames alone (class 0 is never paused)."""
    f = fabric(True, queueing)
    receiver = f.hosts()[0]
    leaf = f.nic_links(receiver)[0][0]
    port = f.intf(leaf, receiver)
    xoff, xon, _ = f.pause_thresholds(leaf, receiver)
    with Emulation(f, app="ecmp", seed=seed, quiet=True) as emu:
        with Sniffer({f.intf(leaf, n): emu.netns(leaf) for n in f.graph[leaf]}) as sniff:
            transfer(emu, incast(f) if queueing == "fifo" else priorities(f), OUT / f"captured-{queueing}-{seed}",
                     OPTIONS, seed=seed, quiet=True)

    def ours(frames: list) -> list:
        return frames if queueing == "fifo" else [fr for fr in frames if fr.tclass == 1]
    sent = ours(sniff.on(port, outgoing=True))
    mac = collections.Counter(fr.dst for fr in sent).most_common(1)[0][0]
    arrived = [(fr.at_ns, fr.length) for n in f.graph[leaf] if n != receiver
               for fr in ours(sniff.on(f.intf(leaf, n), outgoing=False)) if fr.dst == mac]
    cycles, peak = reaction.crossings(arrived, [(fr.at_ns, fr.length) for fr in sent], xoff, xon)
    feeders = {f.intf(leaf, n): [fr.at_ns for fr in ours(sniff.on(f.intf(leaf, n), outgoing=False))]
               for n in f.graph[leaf] if n != receiver}
    packet_ns = (f.mtu + wire.ETH) * 8 / f.rate(leaf, receiver) * 1e9
    result = reaction.reactions(cycles, feeders, packet_ns)
    result.peak_bytes = peak
    return result, packet_ns, f.queue_bytes


def one_run(lossless: bool, seed: int) -> dict:
    f = fabric(lossless)
    messages = incast(f)
    m = run_job(f, messages, OUT / f"incast-{'lossless' if lossless else 'lossy'}-{seed}", options=OPTIONS,
                seed=seed, quiet=True)
    return {"ratio": m.completion_s / bounds.lower_bound_s(f, messages) if m.completion_s else float("nan"),
            "drops": m.queue_drops, "retx": m.packets.retransmits, "pauses": m.pauses.get("events", 0),
            "thread_p99_us": m.pauses.get("reaction_us", {}).get("p99", 0.0), "cpu_bound": m.fidelity.cpu_bound}


def priorities_run(queueing: str, seed: int) -> dict:
    """The incast in class 1 and one flow in class 0 from the receiver's neighbour, lossless."""
    f = fabric(True, queueing)
    messages = priorities(f)
    flow = messages[-1]
    m = run_job(f, messages, OUT / f"priorities-{queueing}-{seed}", options=OPTIONS, seed=seed, quiet=True)
    with (OUT / f"priorities-{queueing}-{seed}" / "messages.csv").open() as rows:
        flow_s = next(float(r["completion_s"]) for r in csv.DictReader(rows) if int(r["id"]) == flow.id)
    share_s = bounds.lower_bound_s(f, [flow]) * 2  # half the receiver's link, as HTB's equal quanta give it
    ports = m.pauses.get("ports", {})
    return {"flow": flow_s / share_s, "ratio": m.completion_s / bounds.lower_bound_s(f, messages),
            "drops": m.queue_drops, "retx": m.packets.retransmits, "pauses": m.pauses.get("events", 0),
            "class0": sum(1 for name in ports if not name.endswith("/tc1")) if queueing == "class" else len(ports),
            "thread_p99_us": m.pauses.get("reaction_us", {}).get("p99", 0.0), "cpu_bound": m.fidelity.cpu_bound}


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    if not features.detect().lossless:
        print("lossless links are not available here (mpft doctor says why)")
        return
    seeds = range(1, args.seeds + 1)
    print("1. from captures of the receiver's leaf: XOFF crossing -> each sending feeder's last frame, and XON "
          "crossing -> its next frame, in packet times at the link rate; one FIFO per port (the incast 15 -> 1), "
          "and class 1 of a queue per class (part 3's run: the incast in class 1 beside a class-0 flow)")
    print(f"{'queues':>6} {'seed':>5} {'cycles':>7} {'pause p50':>10} {'pause p99':>10} {'resume p50':>11} "
          f"{'resume p90':>11} {'<= 1':>6} {'peak/queue':>11}")
    for queueing in ("fifo", "class"):
        pauses, pauses99, resumes, resumes90, within = [], [], [], [], []
        for seed in seeds:
            r, packet_ns, queue = captured(seed, queueing)
            p = [x / packet_ns for x in r.pause_ns]
            s = [x / packet_ns for x in r.resume_ns]
            pauses.append(statistics.median(p))
            pauses99.append(_pct(p, 0.99))
            resumes.append(statistics.median(s))
            resumes90.append(_pct(s, 0.9))
            within.append(sum(x <= 1 for x in s) / len(s))
            print(f"{queueing:>6} {seed:>5} {r.crossings:>7} {pauses[-1]:>10.2f} {pauses99[-1]:>10.2f} "
                  f"{resumes[-1]:>11.2f} {resumes90[-1]:>11.2f} {within[-1]:>6.0%} {r.peak_bytes / queue:>11.0%}")
        print(f"  {queueing}: pause in effect by: median {median_range(pauses, '.2f')}, p99 "
              f"{median_range(pauses99, '.2f')} packet times after the crossing (an upper bound: it includes the one "
              "frame a paused gate lets through, up to a packet time after the pause)")
        print(f"  {queueing}: resumed: median {median_range(resumes, '.2f')}, p90 {median_range(resumes90, '.2f')} "
              f"packet times after the XON crossing, {median_range([w * 100 for w in within], '.0f')} % within one "
              "(goal: <= 1; negative: before it; the tail is feeders with nothing left to send)")
    print("\n2. incast 15 -> 1, same queues and timeout: median (range) over seeds")
    print(f"{'fabric':>9} {'completion/bound':>17} {'drops':>6} {'retx':>5} {'pauses':>7} "
          f"{'thread p99 us':>14} {'CPU-bound runs':>15}")
    for lossless in (False, True):
        runs = [one_run(lossless, seed) for seed in seeds]
        med = {key: statistics.median(r[key] for r in runs) for key in ("drops", "retx", "pauses", "thread_p99_us")}
        print(f"{'lossless' if lossless else 'lossy':>9} {median_range([r['ratio'] for r in runs], '.3f'):>17} "
              f"{med['drops']:>6.0f} {med['retx']:>5.0f} {med['pauses']:>7.0f} {med['thread_p99_us']:>14.0f} "
              f"{sum(r['cpu_bound'] for r in runs):>6} of {len(runs)}")
    print("  (the pause thread's figure runs from the eBPF program's report to its rtnetlink request sent)")
    print("\n3. PFC's priorities, lossless: the incast's 14 senders in class 1, the receiver's neighbour in class 0")
    print(f"{'queueing':>9} {'class-0 flow/share':>19} {'all/bound':>17} {'drops':>6} {'retx':>5} {'pauses':>7} "
          f"{'class-0 queues paused':>22} {'thread p99 us':>14} {'CPU-bound runs':>15}")
    for queueing in ("fifo", "class"):
        runs = [priorities_run(queueing, seed) for seed in seeds]
        med = {key: statistics.median(r[key] for r in runs)
               for key in ("drops", "retx", "pauses", "class0", "thread_p99_us")}
        print(f"{queueing:>9} {median_range([r['flow'] for r in runs], '.2f'):>19} "
              f"{median_range([r['ratio'] for r in runs], '.3f'):>17} {med['drops']:>6.0f} {med['retx']:>5.0f} "
              f"{med['pauses']:>7.0f} {med['class0']:>22.0f} {med['thread_p99_us']:>14.0f} "
              f"{sum(r['cpu_bound'] for r in runs):>6} of {len(runs)}")
    print("  (share: the flow alone at half the receiver's link, HTB's equal share of two busy classes; one FIFO "
          "pauses every queue feeding the receiver, the flow's included)")
    print(f"(run directories under {OUT})")


if __name__ == "__main__":
    with recorded("pause"):
        main()

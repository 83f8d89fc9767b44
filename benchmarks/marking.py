"""How faithful the eBPF ECN marker is (emulator.net.marking, where the kernel has no RED), and what DCQCN does
with its marks, on the 16-host leaf-spine of benchmarks/congestion.py (10 Mbit/s, 128 KB queues).

The marker decides on each packet's arrival from the backlog it keeps itself (the port's HTB rate and burst over a
byte FIFO), not from the qdisc's. While an incast 15 -> 1 runs, a thread samples, about every millisecond, both that
backlog and the kernel's own count for the receiver's downlink (a netlink dump of the qdisc, not the marker's word).
Their difference, in packet times at the link rate, is how early or late a mark can come against a threshold
crossing. The same for a port queueing per class, one sender in class 0 and the rest in class 1: each class's
backlog, which the program gets by sharing the port's drain evenly among the busy classes, against its own queue's
(HTB also serves a class within its guaranteed rate, here the lone sender's, ahead of the others, which the even
share does not model: the difference is up to its burst, two frames).

Then a longer incast, for what DCQCN does with the marks: the switches' marks against the CE marks the receivers
saw, completion / lower bound, the receiver's downlink queue (p99 over the run, how long the start lasts, p99
after it) and the verdict, for cc none (marks nobody answers) and cc ecn (DCQCN), at MTU 9000 and at MTU 1500 (a
14-packet queue against an 87-packet one: emulator.analysis.feedback), with the transport's window and with 6
packets per queue pair (15 x 6 overfill the queue, so the window no longer bounds it: rtt beside them, for
contrast).

    sudo .venv/bin/python benchmarks/marking.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import threading
import time
from pathlib import Path

from results import median_range, recorded

from emulator.analysis import bounds, feedback
from emulator.analysis.timeseries import read_timeseries
from emulator.model import topologies, wire
from emulator.model.schedule import Message
from emulator.model.stats import percentiles
from emulator.net import features, shaping
from emulator.net.emulation import Emulation
from emulator.run.job import run_job
from emulator.run.launch import transfer
from traffic.options import TransportOptions

OUT = Path(tempfile.mkdtemp(prefix="mpft-bench-marking-"))
KB = 1000
LONG = 4096 * KB  # per sender in part 2: DCQCN's start lasts about a second, and a run about 52 s


def fabric(mtu: int = 9000, queueing: str = "fifo"):
    return topologies.build("ft2", leaves=4, hosts_per_leaf=4, spines=4, ecn=True, mtu=mtu, queueing=queueing)


def incast(f, size: int = 512 * KB) -> list[Message]:
    hosts = f.hosts()
    return [Message(i, 0.0, s, hosts[0], size) for i, s in enumerate(hosts[1:])]


def two_classes(f) -> list[Message]:
    """The incast from all but one sender in class 1, and that sender in class 0: both classes of the
    receiver's downlink busy at once."""
    return [dataclasses.replace(m, tclass=int(m.id > 0)) for m in incast(f)]


def tracking(seed: int, queueing: str = "fifo") -> list[float]:
    """|marker's backlog - qdisc's backlog| of the receiver's downlink (each of its two busy classes' queues when
    it queues per class), in packets, over samples where either holds something (cc none: the queue swings
    between empty and full)."""
    f = fabric(queueing=queueing)
    port = f.intf("p0l0", f.hosts()[0])
    packet = f.mtu + wire.ETH
    errors: list[float] = []
    queues = shaping.leaf_classes(queueing)  # the HTB class holding each traffic class's queue
    with Emulation(f, app="ecmp", seed=seed, quiet=True) as emu:
        reader, stop = emu.queue_reader(), threading.Event()

        def sample() -> None:
            while not stop.is_set():
                if queueing == "fifo":
                    pairs = [(emu.net.marker.backlog(port), reader.backlogs().get(port, 0))]
                else:
                    leaves = reader.leaf_backlogs().get(port, {})
                    pairs = [(emu.net.marker.backlog(port, c), leaves.get(queues[c], 0)) for c in (0, 1)]
                errors.extend(abs(virtual - real) / packet for virtual, real in pairs if virtual or real)
                time.sleep(0.001)
        thread = threading.Thread(target=sample)
        thread.start()
        messages = incast(f) if queueing == "fifo" else two_classes(f)
        try:
            transfer(emu, messages, OUT / f"tracking-{queueing}-{seed}", TransportOptions(cc="none"), seed=seed,
                     quiet=True)
        finally:
            stop.set()
            thread.join()
            reader.close()
    return errors


def one_run(cc: str, seed: int, mtu: int, window: int = 0) -> dict:
    f = fabric(mtu)
    messages = incast(f, LONG)
    outdir = OUT / f"incast-{cc}-{mtu}-{window}-{seed}"
    m = run_job(f, messages, outdir, app="ecmp", options=TransportOptions(cc=cc, window=window), seed=seed,
                quiet=True)
    kmin, kmax, _ = f.ecn_thresholds
    samples = read_timeseries(outdir / "timeseries.csv") or {}
    times, queue = samples["queue_bytes"][f.intf("p0l0", f.hosts()[0])]
    start = feedback.settled(queue, kmin, kmax)
    return {"ratio": m.completion_s / bounds.lower_bound_s(f, messages), "marked": m.ecn.get("marked", 0),
            "ce": m.ecn.get("ce_received", 0), "retx": m.packets.retransmits, "cpu_bound": m.fidelity.cpu_bound,
            "sparse": "SPARSE FEEDBACK" in m.fidelity.verdict, "whole": percentiles(queue)["p99"] / f.queue_bytes,
            "start_s": None if start is None else times[start],
            "steady": None if start is None else percentiles(queue[start:])["p99"] / f.queue_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    if features.detect().ecn_marker != "bpf":
        print(f"the eBPF marker is not what marks here (ECN marker: {features.detect().ecn_marker or 'none'})")
        return
    seeds = range(1, args.seeds + 1)
    print("1. the marker's backlog against the qdisc's, receiver's downlink of an incast 15 -> 1 (cc none), "
          "sampled every ~1 ms; |difference| in packet times at the link rate; with a queue per class, one sender in "
          "class 0 and the others in class 1, each class's backlog against its own queue's")
    print(f"{'queues':>6} {'seed':>5} {'samples':>8} {'median':>7} {'p99':>6} {'max':>6}")
    for queueing in ("fifo", "class"):
        medians, p99s = [], []
        for seed in seeds:
            e = tracking(seed, queueing)
            got = percentiles(e)
            medians.append(statistics.median(e))
            p99s.append(got["p99"])
            print(f"{queueing:>6} {seed:>5} {len(e):>8} {medians[-1]:>7.2f} {got['p99']:>6.2f} {got['max']:>6.2f}")
        print(f"  {queueing}: reaction to a threshold crossing: median {median_range(medians, '.2f')}, p99 "
              f"{median_range(p99s, '.2f')} packet times (goal: <= 1)")
    print(f"\n2. incast 15 -> 1 of {LONG // KB} KB per sender on the marking fabric: median (range) over seeds. The "
          "receiver's downlink queue in the run's time series (a sample every 0.2 s): p99 over the whole run, the "
          "start (until the queue is back under kmin after its first time at kmax: senders start at line rate; '-': "
          "not within a tenth of the run, the queue never settled) and p99 after it. Goal for ecn (DCQCN): p99 after "
          "the start <= kmax + 2 MTU with completion <= 1.10, on runs neither CPU-bound nor of sparse feedback "
          "(emulator.analysis.feedback)")
    print(f"{'cc':>5} {'MTU':>5} {'window':>6} {'completion/bound':>18} {'marked':>7} {'CE seen':>8} {'retx':>5} "
          f"{'q p99':>6} {'start s':>8} {'q p99 after':>17} {'kmax+2MTU':>9} {'sparse':>6} {'CPU-bound':>9}")
    rows = [(cc, mtu, 0) for mtu in (9000, 1500) for cc in ("none", "ecn")] + \
        [(cc, 1500, 6) for cc in ("none", "ecn", "rtt")]
    for cc, mtu, window in rows:
        f = fabric(mtu)
        goal = (f.ecn_thresholds[1] + 2 * (f.mtu + wire.ETH)) / f.queue_bytes
        runs = [one_run(cc, seed, mtu, window) for seed in seeds]
        med = {key: statistics.median(r[key] for r in runs) for key in ("marked", "ce", "retx", "whole")}
        settled = [r for r in runs if r["steady"] is not None]
        start, after = (f"{statistics.median(r['start_s'] for r in settled):.1f}",
                        median_range([100 * r["steady"] for r in settled], ".0f") + " %") if settled else ("-", "-")
        if 0 < len(settled) < len(runs):
            after += f" ({len(runs) - len(settled)} never)"
        print(f"{cc:>5} {mtu:>5} {window or 'auto':>6} {median_range([r['ratio'] for r in runs], '.2f'):>18} "
              f"{med['marked']:>7.0f} {med['ce']:>8.0f} {med['retx']:>5.0f} {med['whole']:>6.0%} "
              f"{start:>8} {after:>17} "
              f"{goal:>9.0%} {sum(r['sparse'] for r in runs):>6} {sum(r['cpu_bound'] for r in runs):>4} of "
              f"{len(runs)}")
    print("  (cc none sends nothing ECN-capable, so nothing is marked; a mark and a CE count differ by the marked "
          "packets dropped further on; at MTU 9000 the queue holds 14 packets for 15 senders: sparse feedback)")
    print(f"(run directories under {OUT})")


if __name__ == "__main__":
    with recorded("marking"):
        main()

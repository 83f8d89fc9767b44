"""The built-in studies side by side in one run (every one by default): for each, the table `mpft run` prints, plus
the headline ratios its question turns on (routing: spray / lower bound and ECMP / spray; multi-port: one queue
pair sprayed over both plane ports against the same queue pair kept on one; parity: MRFT / MPFT and the 10 %
slower MPFT / MPFT; voq: when the all-reduce beside the incast was done, per queueing against one FIFO; storage:
each traffic beside the other against alone). With --quick these are the figures the suite's per-study checks
(tests/integration/test_studies.py) state their margins against.

    sudo .venv/bin/python benchmarks/studies.py [routing parity ...] [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from results import recorded

from emulator.study import report, scenario
from emulator.study.metrics import StudyMetrics
from emulator.study.runner import run_study

# (a, b): a / b completion per seed; (a, "bound"): a / its lower bound; (a, b, tag): when a's `tag` traffic was
# done / when b's was (medians over seeds)
HEADLINES = {"routing": [("spray", "bound"), ("ecmp", "spray"), ("adaptive", "spray"), ("static", "spray"),
                         ("perm-ecmp", "perm-spray")],
             "parity": [("mrft", "mpft"), ("mpft-slow", "mpft"), ("mpft", "mpft-slow")],
             "multiport": [("fixed", "spray"), ("one-port", "spray")],
             "failover": [("ecmp", "spray")],
             "storage": [("both", "compute-only", "moe/combine"), ("both", "storage-only", "storage/read")],
             "voq": [("class", "fifo", "ring-allreduce/allgather"), ("voq", "fifo", "ring-allreduce/allgather")],
             "asymmetry": [("perm-ecmp", "perm-adaptive"), ("a2a-spray", "a2a-adaptive")],
             "ordering": [("fence", "psn")],
             "cc": [("none", "pull"), ("rtt", "pull")],
             "lossless": [("lossless", "lossy"), ("rtt", "lossy")]}


def headline(metrics: StudyMetrics, a: str, b: str, tag: str = "") -> str:
    va = metrics.variants.get(a)
    if va is None or (b != "bound" and b not in metrics.variants):
        return f"{a} / {b}: not run"
    if tag:
        done = [v.by_tag[tag].completion_s if tag in v.by_tag else None for v in (va, metrics.variants[b])]
        if None in done or not done[1]:
            return f"{a} / {b} {tag}: not done in both"
        return f"{a} / {b} {tag} done at: {done[0] / done[1]:.2f} (medians over seeds)"
    if b == "bound":
        lo, hi = va.range["ratio_to_bound"] or (None, None)
        return f"{a} / lower bound: median {va.ratio_to_bound:.2f} (range {lo:.2f}-{hi:.2f})"
    measured = metrics.ratio(a, b)
    if measured is None:
        return f"{a} / {b}: no completed pair of runs"
    median, lo, hi = measured
    return f"{a} / {b} completion: median {median:.2f} (range {lo:.2f}-{hi:.2f})"


def main(args: argparse.Namespace) -> None:
    out = Path(tempfile.mkdtemp(prefix="mpft-bench-studies-"))
    for name in args.studies:
        metrics = run_study(scenario.load(name, quick=args.quick), out / name)
        print(f"\n== {name}: {metrics.question}")
        print(report.format_table(metrics))
        for spec in HEADLINES.get(name, []):
            print("  " + headline(metrics, *spec))
        print(f"  report: {out / name / 'report.html'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", nargs="*", default=scenario.builtin_names())
    parser.add_argument("--quick", action="store_true")
    parsed = parser.parse_args()
    # a subset of the studies gets a section of its own in RESULTS.md, beside every study's
    section = "studies" if parsed.studies == scenario.builtin_names() else "studies-" + "-".join(parsed.studies)
    with recorded(section + ("-quick" if parsed.quick else "")):
        main(parsed)

"""The built-in studies at full length, side by side in one run: for each, the table `mpft run` prints, plus the
headline ratios the paper's questions turn on (routing: spray / lower bound and ECMP / spray; multi-port: one
queue pair sprayed over both plane ports against the same queue pair kept on one; parity: MRFT / MPFT and the
10 % slower MPFT / MPFT).

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

HEADLINES = {"routing": [("spray", "bound"), ("ecmp", "spray"), ("adaptive", "spray"), ("static", "spray")],
             "parity": [("mrft", "mpft"), ("mpft-slow", "mpft")],
             "multiport": [("fixed", "spray"), ("one-port", "spray")],
             "failover": [("ecmp", "spray")],
             "storage": [("both", "compute-only"), ("both", "storage-only")]}


def headline(metrics: StudyMetrics, a: str, b: str) -> str:
    va = metrics.variants.get(a)
    if va is None:
        return f"{a}: not run"
    if b == "bound":
        lo, hi = va.range["ratio_to_bound"] or (None, None)
        return f"{a} / lower bound: median {va.ratio_to_bound:.2f} (range {lo:.2f}-{hi:.2f})"
    measured = metrics.ratio(a, b)
    if measured is None:
        return f"{a} / {b}: no completed pair of runs"
    median, lo, hi = measured
    return f"{a} / {b} completion: median {median:.2f} (range {lo:.2f}-{hi:.2f})"


DEFAULT = ["routing", "multiport", "parity"]


def main(args: argparse.Namespace) -> None:
    out = Path(tempfile.mkdtemp(prefix="mpft-bench-studies-"))
    for name in args.studies:
        metrics = run_study(scenario.load(name, quick=args.quick), out / name)
        print(f"\n== {name}: {metrics.question}")
        print(report.format_table(metrics))
        for a, b in HEADLINES.get(name, []):
            print("  " + headline(metrics, a, b))
        print(f"  report: {out / name / 'report.html'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", nargs="*", default=DEFAULT)
    parser.add_argument("--quick", action="store_true")
    parsed = parser.parse_args()
    # other studies than the default set get a section of their own in RESULTS.md, beside the default one's
    with recorded("studies" if parsed.studies == DEFAULT else "studies-" + "-".join(parsed.studies)):
        main(parsed)

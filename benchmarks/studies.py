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

from emulator.study import report, scenario
from emulator.study import runner as study

HEADLINES = {"routing": [("spray", "bound"), ("ecmp", "spray"), ("adaptive", "spray"), ("static", "spray")],
             "parity": [("mrft", "mpft"), ("mpft-slow", "mpft")],
             "multiport": [("fixed", "spray"), ("one-port", "spray")],
             "failover": [("ecmp", "spray")],
             "storage": [("both", "compute-only"), ("both", "storage-only")]}


def headline(metrics: dict, a: str, b: str) -> str:
    va = metrics["variants"].get(a)
    if va is None:
        return f"{a}: not run"
    if b == "bound":
        lo, hi = va["range"]["ratio_to_bound"] or (None, None)
        return f"{a} / lower bound: median {va['ratio_to_bound']:.2f} (range {lo:.2f}-{hi:.2f})"
    c = metrics["comparisons"].get(f"{a}/{b}") or metrics["comparisons"].get(f"{b}/{a}")
    if c is None:
        return f"{a} / {b}: no completed pair of runs"
    if f"{a}/{b}" not in metrics["comparisons"]:
        c = {"median": 1 / c["median"], "range": [1 / c["range"][1], 1 / c["range"][0]]}
    return f"{a} / {b} completion: median {c['median']:.2f} (range {c['range'][0]:.2f}-{c['range'][1]:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", nargs="*", default=["routing", "multiport", "parity"])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="mpft-bench-studies-"))
    for name in args.studies:
        metrics = study.run_study(scenario.load(name, quick=args.quick), out / name)
        print(f"\n== {name}: {metrics['question']}")
        print(report.format_table(metrics))
        for a, b in HEADLINES.get(name, []):
            print("  " + headline(metrics, a, b))
        print(f"  report: {out / name / 'report.html'}")


if __name__ == "__main__":
    main()

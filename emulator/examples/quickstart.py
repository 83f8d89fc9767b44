"""The Python API in one script: build a fabric, bring it up and run a pattern on it, then read what every message
did with pandas (`pip install 'mpft-emu[pandas]'`; without it the script says so and stops there).

    sudo .venv/bin/python -m emulator.examples.quickstart [OUTDIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

from emulator.analysis import bounds
from emulator.model import topologies
from emulator.run.job import run_job
from traffic import patterns
from traffic.options import TransportOptions


def main(outdir: Path) -> None:
    fabric = topologies.build("ft2", leaves=2, hosts_per_leaf=2, spines=2)  # pure: nothing starts yet
    messages = patterns.generate("permutation", fabric, kind="shift", shift=2, size=1_000_000)
    # one job on a fresh emulation: OVS, the controller app, the hosts, the agents, then teardown
    metrics = run_job(fabric, messages, outdir, app="spray", options=TransportOptions(entropy="spray"), quiet=True)
    bound = bounds.lower_bound_s(fabric, messages)
    print(f"completion {metrics.completion_s:.2f} s, {metrics.completion_s / bound:.2f}x the lower bound; "
          f"{metrics.packets.retransmits} retransmissions; {metrics.fidelity.verdict}")
    try:
        import pandas
    except ImportError:
        print(f"pandas is not installed (pip install 'mpft-emu[pandas]'); the per-message rows are in "
              f"{outdir / 'messages.csv'}")
        return
    frame = pandas.read_csv(outdir / "messages.csv")
    print("longest message completion (s) by sender:")
    print(frame.groupby("src")["completion_s"].max().to_string(header=False))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("results") / "quickstart")

"""timeseries.csv read back (emulator.net.monitor.write_timeseries writes it): t_s, kind, name, value."""

from __future__ import annotations

import csv
from pathlib import Path

Samples = dict[str, dict[str, tuple[list[float], list[float]]]]  # kind -> name -> (t_s, values)


def read_timeseries(path: Path) -> Samples | None:
    """timeseries.csv as write_timeseries wrote it, by kind and name (None: no such file)."""
    if not path.is_file():
        return None
    samples: Samples = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            t, v = samples.setdefault(row["kind"], {}).setdefault(row["name"], ([], []))
            t.append(float(row["t_s"]))
            v.append(float(row["value"]))
    return samples

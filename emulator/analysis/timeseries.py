"""timeseries.csv, a run's samples in long form (t_s, kind, name, value: pandas reads it as it is): written from
the monitors' rows (emulator.net.monitor.timeseries_rows), read back by kind and name."""

from __future__ import annotations

import csv
from pathlib import Path

Row = tuple[float, str, str, float]  # t_s, kind, name, value
Samples = dict[str, dict[str, tuple[list[float], list[float]]]]  # kind -> name -> (t_s, values)


def write_timeseries(path: Path, rows: list[Row]) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["t_s", "kind", "name", "value"])
        writer.writerows((f"{t:.3f}", kind, name, f"{value:.4g}") for t, kind, name, value in rows)


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

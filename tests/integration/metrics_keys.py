"""The key paths of a metrics.json, for the baseline that keeps later changes from dropping keys.

A path joins keys with "/", "[]" stands for every element of a list of records, and a percentile summary
(a record with "count") counts as one value: which of its keys exist depends on the data, not the schema."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BASELINE = Path(__file__).parent / "baseline" / "metrics_keys.json"


def key_paths(value: object, prefix: str = "") -> set[str]:
    if isinstance(value, dict) and "count" not in value:
        return {p for k, v in value.items() for p in key_paths(v, f"{prefix}/{k}")} or {prefix}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return {p for v in value for p in key_paths(v, prefix + "[]")}
    return {prefix}


if __name__ == "__main__":  # python -m tests.integration.metrics_keys RESULTS_DIR...: one entry per study
    baseline = {Path(d).name: sorted(key_paths(json.loads((Path(d) / "metrics.json").read_text())))
                for d in sys.argv[1:]}
    BASELINE.write_text(json.dumps(baseline, indent=1) + "\n")

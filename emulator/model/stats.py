"""Summary statistics every layer reports the same way."""

from __future__ import annotations

import statistics


def percentiles(values: list[float]) -> dict[str, float]:
    """count, min, p50, p90, p99, max and mean of `values` (just the count when there are none)."""
    if not values:
        return {"count": 0}
    values = sorted(values)

    def at(q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]
    return {"count": len(values), "min": values[0], "p50": at(0.5), "p90": at(0.9), "p99": at(0.99),
            "max": values[-1], "mean": statistics.fmean(values)}

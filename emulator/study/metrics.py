"""A study's results as typed records: built once by the study (emulator.study.runner), written once as
`metrics.json`, and read back by the report. The contract is documented in emulator/study/README.md; keys may be
added, never dropped (tests/integration/baseline/metrics_keys.json)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from emulator.analysis import feedback
from emulator.model.errors import load_json
from emulator.model.records import from_dict
from emulator.run.metrics import Fidelity, Ordering, TagSummary

Span = list[float | None]  # [lowest, highest] over seeds
RUN_COLUMNS = ("completion_s", "lower_bound_s", "ratio_to_bound", "goodput_bps", "lost_messages", "message_p99_s",
               "out_of_order_fraction", "retransmits", "pauses", "paused_s")
FIDELITY_COLUMNS = ("cpu_bound", "unfaithful", "cpu_idle", "cpu_free", "rate_ratio", "timer_lateness_us_p99",
                    "agents_cpu_s", "switches_cpu_s", "feedback_per_drain", "verdict")


def sparse_feedback(runs: Iterable[tuple[str, RunResult]]) -> dict[str, float]:
    """Variant -> its fewest looks per drain, for the variants whose senders saw their queues too rarely to
    settle them in some run (emulator.analysis.feedback)."""
    out: dict[str, float] = {}
    for name, r in runs:
        per_drain = r.fidelity.feedback_per_drain if r.fidelity else None
        if per_drain is not None and per_drain < feedback.ENOUGH:
            out[name] = min(per_drain, out.get(name, per_drain))
    return out


def slowdown(tag: TagSummary) -> float | None:
    """A tag's completion over the lower bound of its messages alone: 1 is as fast as an empty fabric allows."""
    return tag.completion_s / tag.lower_bound_s if tag.completion_s and tag.lower_bound_s else None


@dataclass
class PlaneWindows:
    """With faults: each plane's mean forwarded rate (Mbit/s) before the first fault, until the restore and
    after it; for each failed plane, how long after the fault its rate stayed below half of before."""

    planes: dict[int, dict[str, float | None]] = field(default_factory=dict)
    recovery_s: dict[int, float | None] = field(default_factory=dict)


@dataclass
class RunResult:
    """One variant at one seed on its own fabric (its directory is `dir`)."""

    seed: int = 0
    dir: str = ""
    completion_s: float | None = None  # None when a message was lost
    goodput_bps: float = 0.0
    lower_bound_s: float | None = None
    lost_messages: int = 0
    ratio_to_bound: float | None = None
    message_p99_s: float | None = None
    out_of_order_fraction: float = 0.0
    retransmits: int = 0
    by_tag: dict[str, TagSummary] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    queues: dict[str, float] = field(default_factory=dict)
    planes: PlaneWindows | None = None
    ordering: Ordering | None = None
    fidelity: Fidelity | None = None
    pauses: int = 0  # lossless fabrics: pause events (emulator.net.pause)
    paused_s: float = 0.0  # and the time egresses spent paused, summed over them


@dataclass
class OrderingSummary:
    mode: str = ""
    violations: int = 0
    sends: int = 0
    flag_wait_us_p99: float | None = None
    fence_wait_us_p99: float | None = None


@dataclass
class VariantSummary:
    """Medians over seeds (sums for counts) of one variant's runs, and the runs themselves."""

    completion_s: float | None = None
    goodput_bps: float | None = None
    lower_bound_s: float | None = None
    ratio_to_bound: float | None = None
    message_p99_s: float | None = None
    out_of_order_fraction: float | None = None
    lost_messages: int = 0
    retransmits: int = 0
    range: dict[str, Span | None] = field(default_factory=dict)  # completion_s and ratio_to_bound
    by_tag: dict[str, TagSummary] = field(default_factory=dict)  # medians of the runs' (sums for counts)
    queue_max_bytes: float | None = None
    queue_p50_bytes: float | None = None
    queue_p99_bytes: float | None = None
    pauses: float | None = None  # lossless fabrics: median pause events and paused time over seeds
    paused_s: float | None = None
    ordering: OrderingSummary | None = None
    recovery_s: dict[str, float | None] = field(default_factory=dict)
    plane_mbps: dict[str, dict[str, float | None]] = field(default_factory=dict)
    runs: list[RunResult] = field(default_factory=list)


@dataclass
class Comparison:
    """Completion-time ratio a/b per seed: median and range."""

    median: float | None = None
    range: Span | None = None


@dataclass
class StudyFidelity:
    """Over every run: CPU-bound (or unfaithful) if any was, the lowest backlogged-link rate and idle share, the
    latest timers."""

    cpu_bound: bool = False
    unfaithful: bool = False
    rate_ratio: float | None = None
    cpu_idle: float | None = None
    timer_lateness_us_p99: float | None = None
    verdict: str = ""


@dataclass
class StudyMetrics:
    scenario: str = ""
    question: str = ""
    seeds: list[int] = field(default_factory=list)
    variants: dict[str, VariantSummary] = field(default_factory=dict)
    comparisons: dict[str, Comparison] = field(default_factory=dict)  # within groups only
    groups: dict[str, list[str]] = field(default_factory=dict)  # traffic -> the variants that ran it ({}: one)
    fidelity: StudyFidelity | None = None
    skipped: dict[str, str] = field(default_factory=dict)  # optional variants this machine cannot run, and why
    focus: str = ""  # the traffic tag the question is about (the scenario's `focus`), or none
    incomplete: str = ""  # why the study stopped before its last run ("": it did not)
    answer: str = ""  # the question's answer in one sentence, from the figures above (emulator.study.answer)

    def ratio(self, a: str, b: str) -> tuple[float, float, float] | None:
        """a/b completion per seed: median, lowest, highest, from the comparison either way round (None: no
        completed pair of runs)."""
        c = self.comparisons.get(f"{a}/{b}")
        if c is not None and c.median and c.range and None not in c.range:
            return c.median, float(c.range[0] or 0.0), float(c.range[1] or 0.0)
        c = self.comparisons.get(f"{b}/{a}")
        if c is not None and c.median and c.range and c.range[0] and c.range[1]:
            return 1 / c.median, 1 / c.range[1], 1 / c.range[0]
        return None

    def runs(self) -> list[tuple[str, RunResult]]:
        return [(name, run) for name, v in self.variants.items() for run in v.runs]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def run_rows(self) -> list[dict[str, Any]]:
        """runs.csv: one flat row per variant and seed (pandas reads it as is), with its fidelity and, per traffic
        tag, its completion and lower bound alone."""
        tags = sorted({tag for _, run in self.runs() for tag in run.by_tag})
        rows = []
        for name, run in self.runs():
            f = run.fidelity or Fidelity()
            rows.append({"variant": name, "seed": run.seed, "dir": run.dir,
                         **{key: getattr(run, key) for key in RUN_COLUMNS},
                         "queue_max_bytes": run.queues.get("max_bytes"), "queue_p50_bytes": run.queues.get("p50_bytes"),
                         "queue_p99_bytes": run.queues.get("p99_bytes"),
                         **{key: getattr(f, key) for key in FIDELITY_COLUMNS},
                         **{f"{tag}:{key}": getattr(run.by_tag.get(tag, TagSummary()), key)
                            for tag in tags for key in ("completion_s", "lower_bound_s")}})
        return rows

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudyMetrics:
        return from_dict(cls, data)

    @classmethod
    def load(cls, path: Path) -> StudyMetrics:
        return cls.from_dict(load_json(path, "metrics"))

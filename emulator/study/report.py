"""The study report: a plain-text table for the terminal and an HTML page with plots, both read from a run
directory (metrics.json, scenario.json and each run's timeseries.csv / messages.csv), so a report can be redrawn
without re-running the emulation.
"""

from __future__ import annotations

import csv
import html
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulator.analysis.fidelity import BUSY_THREAD, IDLE_FLOOR, verdict
from emulator.analysis.timeseries import Samples, read_timeseries
from emulator.model.errors import load_json
from emulator.study.answer import answer, kib
from emulator.study.metrics import StudyMetrics, slowdown

VARIANT_COLUMNS = ("variant", "completion ms", "range ms", "bound ms", "ratio", "goodput Mbit/s", "lost",
                   "p99 msg ms")
TAG_COLUMNS = ("variant", "tag", "done at ms", "x alone", "p99 msg ms", "lost")
RUN_COLUMNS = ("variant", "seed", "completion ms", "ratio", "lost", "rate ratio", "CPU-bound", "run dir")
TOP_INTERFACES = 4

Series = tuple[str, list[float], list[float]]  # label, t_s, values


@dataclass
class Plot:
    file: str
    title: str
    drawn: bool
    note: str = ""


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Aligned columns: text to the left, numbers to the right."""
    cells = [list(headers)] + [[str(c) for c in row] for row in rows]
    columns = list(zip(*cells, strict=True))
    widths = [max(map(len, col)) for col in columns]
    text = [any(c[:1].isalpha() for c in col[1:]) for col in columns]
    return "\n".join("  ".join(c.ljust(w) if left else c.rjust(w)
                               for c, w, left in zip(r, widths, text, strict=True)).rstrip() for r in cells)


class _Html(str):
    """Text that is already HTML (a link): table cells of this type are not escaped again."""


# -- numbers -------------------------------------------------------------------------------------------------
def _num(value: float | None, fmt: str = ".2f", scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, fmt)


def _span(pair: list[float | None] | None, fmt: str = ".2f", scale: float = 1.0) -> str:
    if not pair or any(v is None for v in pair):
        return "-"
    return f"{_num(pair[0], fmt, scale)}..{_num(pair[1], fmt, scale)}"


def variant_rows(metrics: StudyMetrics) -> list[list[str]]:
    """One row of VARIANT_COLUMNS per variant (medians over seeds; sums for lost), as display strings."""
    return [[name, _num(v.completion_s, ".1f", 1e3), _span(v.range.get("completion_s"), ".1f", 1e3),
             _num(v.lower_bound_s, ".1f", 1e3), _num(v.ratio_to_bound), _num(v.goodput_bps, ".2f", 1e-6),
             _num(v.lost_messages, ".0f"), _num(v.message_p99_s, ".1f", 1e3)]
            for name, v in metrics.variants.items()]


def comparison_lines(metrics: StudyMetrics) -> list[str]:
    return [f"{pair} completion-time ratio: median {_num(c.median)}, range {_span(c.range)} over seeds"
            for pair, c in metrics.comparisons.items()]


def fidelity_verdict(metrics: StudyMetrics) -> tuple[bool | None, str]:
    """(does not count, verdict): whether a run was CPU-bound or UNFAITHFUL, None when metrics.json has no
    fidelity at all. A CPU-bound study's verdict always starts with CPU-BOUND (else an unfaithful one's with
    UNFAITHFUL), also when only a run's monitor said so and the summary did not."""
    fid = metrics.fidelity
    bound_runs = [run.dir for _, run in metrics.runs() if run.fidelity and run.fidelity.cpu_bound]
    unfaithful_runs = [run.dir for _, run in metrics.runs() if run.fidelity and run.fidelity.unfaithful]
    if fid is None and not bound_runs:
        return None, "fidelity unknown: metrics.json has no CPU monitor verdict"
    bound = bool(fid and fid.cpu_bound or bound_runs)
    said = fid.verdict if fid and fid.verdict else "not CPU-bound"
    if bound and not said.startswith("CPU-BOUND"):
        said = verdict(bound_runs, None, cpu_bound=True, unfaithful_in=unfaithful_runs)
    elif unfaithful_runs and not said.startswith(("CPU-BOUND", "UNFAITHFUL")):
        said = verdict([], None, unfaithful_in=unfaithful_runs)
    return bound or bool(unfaithful_runs), said


def tag_rows(metrics: StudyMetrics) -> list[list[str]]:
    """One row of TAG_COLUMNS per variant and traffic tag (medians over seeds; sums for lost); "x alone" is the
    tag's completion over the lower bound of its messages by themselves."""
    return [[name, tag, _num(t.completion_s, ".1f", 1e3), _num(slowdown(t)), _num(t.message_p99_s, ".1f", 1e3),
             _num(t.lost, ".0f")] for name, v in metrics.variants.items() for tag, t in v.by_tag.items()]


def detail_lines(metrics: StudyMetrics) -> list[str]:
    """What some studies measure beyond completion: queue depth, ordering, failure recovery."""
    lines = []
    for name, v in metrics.variants.items():
        parts = []
        if v.queue_max_bytes is not None:
            parts.append(f"deepest queue {kib(v.queue_max_bytes)} KiB, backlog p50 {kib(v.queue_p50_bytes)} KiB, "
                         f"p99 {kib(v.queue_p99_bytes)} KiB")
        if v.pauses:
            parts.append(f"{v.pauses:.0f} pauses, {v.paused_s:.1f} s paused over all egresses")
        o = v.ordering
        if o and o.sends:
            parts.append(f"ordering {o.mode}: {o.violations} violations in {o.sends} flags, flag wait p99 "
                         f"{_num(o.flag_wait_us_p99, '.0f')} us, fence wait p99 {_num(o.fence_wait_us_p99, '.0f')} us")
        for plane, gap in v.recovery_s.items():
            parts.append(f"plane {plane} back to half its rate {_num(gap, '.0f', 1e3)} ms after the first fault")
        for plane, w in v.plane_mbps.items():
            parts.append(f"plane {plane} Mbit/s before/during/after {_num(w.get('before'), '.0f')}/"
                         f"{_num(w.get('during'), '.0f')}/{_num(w.get('after'), '.0f')}")
        if parts:
            lines.append(f"{name}: " + "; ".join(parts))
    return lines


def format_table(metrics: StudyMetrics) -> str:
    """The table `mpft run` prints: the answer, one row per variant, then the comparisons, the per-tag table where
    there is more than one tag, the details, then the fidelity verdict."""
    tags = tag_rows(metrics)
    several = len({row[1] for row in tags}) > 1
    return "\n".join([f"answer: {metrics.answer or answer(metrics)}",
                      text_table(VARIANT_COLUMNS, variant_rows(metrics)), *comparison_lines(metrics),
                      *([text_table(TAG_COLUMNS, tags)] if several else []), *detail_lines(metrics),
                      fidelity_verdict(metrics)[1]])


# -- reading a run's files -----------------------------------------------------------------------------------
def _read_completions(path: Path) -> list[float] | None:
    if not path.is_file():
        return None
    with path.open(newline="") as fh:
        return [float(row["completion_s"]) for row in csv.DictReader(fh) if row["completion_s"]]


# -- plots ---------------------------------------------------------------------------------------------------
@contextmanager
def _figure(path: Path, title: str, rows: int = 1, row_height: float = 3.0) -> Iterator[list[Any]]:
    """A figure of `rows` panels saved to `path`: matplotlib's Figure alone (files only, no pyplot state and no
    GUI toolkit), loaded here so that the commands that draw nothing start without it."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 0.6 + row_height * rows))
    axes = fig.subplots(rows, 1, squeeze=False, sharex=True)
    fig.suptitle(title, fontsize=11)
    yield list(axes[:, 0])
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _skipped(outdir: Path, file: str, title: str, note: str) -> Plot:
    (outdir / file).unlink(missing_ok=True)  # a figure from an earlier report would no longer match
    return Plot(file, title, False, note)


def _plot_completion(outdir: Path, metrics: StudyMetrics) -> Plot:
    file, title = "completion.png", "Completion time relative to the lower bound"
    variants = metrics.variants
    ratios = {name: v.ratio_to_bound for name, v in variants.items()}
    if all(r is None for r in ratios.values()):
        return _skipped(outdir, file, title, "no variant has a completion/bound ratio (messages lost?)")
    with _figure(outdir / file, title) as (ax,):
        for x, (name, ratio) in enumerate(ratios.items()):
            if ratio is None:
                ax.text(x, 0.05, "no result", ha="center", rotation=90, fontsize=8)
                continue
            lo, hi = variants[name].range.get("ratio_to_bound") or (None, None)
            lo, hi = ratio if lo is None else lo, ratio if hi is None else hi
            err = [[max(ratio - lo, 0)], [max(hi - ratio, 0)]]
            bars = ax.bar(x, ratio, yerr=err, capsize=4, color="tab:blue", width=0.6)
            ax.bar_label(bars, fmt="%.2f", fontsize=8, label_type="center", color="white")
        ax.axhline(1.0, linestyle="--", color="black", linewidth=1, label="lower bound")
        ax.set_xticks(range(len(ratios)), list(ratios))
        ax.set_xlabel("variant (bar: median over seeds, whiskers: min-max)")
        ax.set_ylabel("completion / lower bound (x)")
        ax.legend(fontsize=8)
    return Plot(file, title, True)


def _plot_messages_cdf(outdir: Path, metrics: StudyMetrics) -> Plot:
    file, title = "messages_cdf.png", "Per-message completion time (all seeds)"
    pooled: dict[str, list[float]] = {}
    missing = []
    for variant, run in metrics.runs():
        times = _read_completions(outdir / run.dir / "messages.csv")
        if times is None:
            missing.append(run.dir)
        pooled.setdefault(variant, []).extend(times or [])
    note = f"no messages.csv in {', '.join(missing)}" if missing else ""
    if not any(pooled.values()):
        return _skipped(outdir, file, title, note or "no completed messages in any run")
    with _figure(outdir / file, title) as (ax,):
        for variant, times in pooled.items():
            if times:
                times.sort()
                ax.step([t * 1e3 for t in times], [(i + 1) / len(times) for i in range(len(times))], where="post",
                        label=f"{variant} (n={len(times)})")
        ax.set_xlabel("message completion time (ms)")
        ax.set_ylabel("fraction of messages")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=8)
    return Plot(file, title, True, note)


def _plot_series(outdir: Path, metrics: StudyMetrics, file: str, title: str, ylabel: str,
                 select: Callable[[Samples], list[Series]], hlines: tuple[tuple[float, str, str], ...] = ()) -> Plot:
    """One subplot per variant from its first run's timeseries.csv; `select` picks the lines to draw."""
    panels = []
    for variant, v in metrics.variants.items():
        run = v.runs[0] if v.runs else None
        samples = read_timeseries(outdir / run.dir / "timeseries.csv") if run else None
        panels.append((f"{variant} (seed {run.seed})" if run else variant, select(samples) if samples else []))
    empty = [name for name, series in panels if not series]
    note = f"no samples (timeseries.csv missing or without them) for {', '.join(empty)}" if empty else ""
    if len(empty) == len(panels):
        return _skipped(outdir, file, title, note or "no variants")
    with _figure(outdir / file, title, rows=len(panels), row_height=2.2) as axes:
        for ax, (name, series) in zip(axes, panels, strict=True):
            ax.set_title(name, fontsize=9)
            ax.set_ylabel(ylabel, fontsize=8)
            if not series:
                ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center", va="center")
                continue
            for label, t, values in series:
                ax.plot(t, values, linewidth=1, label=label)
            for y, label, style in hlines:
                ax.axhline(y, linestyle=style, color="red", linewidth=1, label=label)
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: never hides a line
        axes[-1].set_xlabel("time (s)")
    return Plot(file, title, True, note)


def _busiest(kind: str, rank: Callable[[list[float]], float], scale: float) -> Callable[[Samples], list[Series]]:
    """The TOP_INTERFACES series of `kind` ranked by `rank` of their values, scaled for display."""
    def select(samples: Samples) -> list[Series]:
        series = samples.get(kind, {})
        names = sorted(sorted(series), key=lambda n: rank(series[n][1]), reverse=True)[:TOP_INTERFACES]
        return [(n, series[n][0], [v * scale for v in series[n][1]]) for n in names]
    return select


def _cpu(samples: Samples) -> list[Series]:
    return [(label, t, [v * 100 for v in values])
            for kind, label in (("cpu_idle", "machine idle"), ("cpu_free", "free for the run"),
                                ("vswitchd_thread", "busiest vswitchd thread"),
                                ("process_thread", "busiest agent or controller thread"))
            for t, values in samples.get(kind, {}).values()]


def _plots(outdir: Path, metrics: StudyMetrics) -> list[Plot]:
    return [
        _plot_completion(outdir, metrics),
        _plot_messages_cdf(outdir, metrics),
        _plot_series(outdir, metrics, "links.png", f"Utilisation of the {TOP_INTERFACES} busiest interfaces",
                     "utilisation (%)", _busiest("link_util", lambda v: sum(v) / len(v), 100.0)),
        _plot_series(outdir, metrics, "queues.png", f"Egress backlog of the {TOP_INTERFACES} deepest queues",
                     "backlog (KiB)", _busiest("queue_bytes", max, 1 / 1024)),
        _plot_series(outdir, metrics, "cpu.png", "CPU: machine idle, busiest ovs-vswitchd and run-process threads",
                     "share (%)", _cpu, ((IDLE_FLOOR * 100, f"free floor {IDLE_FLOOR:.0%}", "--"),
                            (BUSY_THREAD * 100, f"thread ceiling {BUSY_THREAD:.0%}", ":"))),
    ]


# -- HTML ----------------------------------------------------------------------------------------------------
CSS = """body { font-family: sans-serif; max-width: 1000px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f2f2f2; }
tr.bad td { background: #fde0e0; }
.banner { padding: 0.7em 1em; font-weight: bold; color: white; border-radius: 4px; }
.banner.bad { background: #c62828; } .banner.good { background: #2e7d32; } .banner.unknown { background: #b26a00; }
.question { font-size: 1.1em; font-style: italic; }
.answer { font-size: 1.2em; font-weight: bold; }
.note { color: #8a4b00; }
img { max-width: 100%; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; }"""


def _table(header: tuple[str, ...], rows: list[list[str]], row_classes: list[str] | None = None) -> str:
    def cell(value: str) -> str:
        return value if isinstance(value, _Html) else html.escape(value)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join((f'<tr class="{cls}">' if cls else "<tr>") + "".join(f"<td>{cell(c)}</td>" for c in row) + "</tr>"
                   for row, cls in zip(rows, row_classes or [""] * len(rows), strict=True))
    return f"<table><tr>{head}</tr>{body}</table>"


def _run_rows(metrics: StudyMetrics) -> tuple[list[list[str]], list[str]]:
    rows, classes = [], []
    for variant, run in metrics.runs():
        fid = run.fidelity
        said = "-" if fid is None else "yes" if fid.cpu_bound else "UNFAITHFUL" if fid.unfaithful else "no"
        link = _Html(f'<a href="{html.escape(run.dir)}/">{html.escape(run.dir)}</a>')
        rows.append([variant, str(run.seed), _num(run.completion_s, ".1f", 1e3), _num(run.ratio_to_bound),
                     _num(run.lost_messages, ".0f"), _num(fid.rate_ratio if fid else None), said, link])
        classes.append("bad" if fid and not fid.counts else "")
    return rows, classes


def _plot_html(plot: Plot) -> str:
    title, note = html.escape(plot.title), html.escape(plot.note)
    if not plot.drawn:
        return f'<p class="note">{title}: not drawn: {note}</p>'
    caption = f'{title}<br><span class="note">{note}</span>' if note else title
    return f'<figure><img src="{html.escape(plot.file)}" alt="{title}"><figcaption>{caption}</figcaption></figure>'


def write_report(outdir: Path) -> Path:
    """Draw the plots into `outdir` and write outdir/report.html (links to them relatively); returns its path."""
    outdir = Path(outdir)
    metrics = StudyMetrics.load(outdir / "metrics.json")
    scenario_path = outdir / "scenario.json"
    scenario = load_json(scenario_path, "scenario") if scenario_path.is_file() else None
    name = metrics.scenario or (scenario or {}).get("name") or outdir.name
    question = metrics.question or (scenario or {}).get("question") or ""
    bound, said = fidelity_verdict(metrics)
    banner = {True: "bad", False: "good", None: "unknown"}[bound]
    comparisons = "".join(f"<li>{html.escape(line)}</li>" for line in comparison_lines(metrics))
    run_rows, run_classes = _run_rows(metrics)
    scenario_html = (f"<pre>{html.escape(json.dumps(scenario, indent=2))}</pre>" if scenario is not None
                     else '<p class="note">no scenario.json in this run directory</p>')
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(name)}</title>
<style>
{CSS}
</style></head>
<body>
<h1>{html.escape(name)}</h1>
{f'<p class="question">{html.escape(question)}</p>' if question else ""}
<p class="answer">{html.escape(metrics.answer or answer(metrics))}</p>
<div class="banner {banner}">{html.escape(said)}</div>
<h2>Variants</h2>
<p>Medians over seeds {html.escape(", ".join(str(s) for s in metrics.seeds))}; lost is the sum.</p>
{_table(VARIANT_COLUMNS, variant_rows(metrics))}
{f"<ul>{comparisons}</ul>" if comparisons else ""}
<h2>By traffic tag</h2>
{_table(TAG_COLUMNS, tag_rows(metrics))}
{"".join(f"<p>{html.escape(line)}</p>" for line in detail_lines(metrics))}
<h2>Runs</h2>
{_table(RUN_COLUMNS, run_rows, run_classes)}
<h2>Plots</h2>
{"".join(_plot_html(plot) for plot in _plots(outdir, metrics))}
<details><summary>Resolved scenario</summary>
{scenario_html}
</details>
</body></html>
"""
    path = outdir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path

"""A study's answer in one sentence, computed from what it measured: which variant finished soonest and by how
much against the slowest (the per-seed completion-time ratio, median and range), how close that came to the lower
bound, whose queues were shortest where they differ, the evidence that explains it (whether the busiest links
were the hosts' own, which no routing relieves, or the fabric's), and whether the runs can be believed (CPU-bound,
or congestion control that saw its queue too rarely: emulator.analysis.feedback). Variants on different traffic
(a study's `groups`) get a clause each. `metrics.json` carries it as `answer`; the console and report.html print
it under the question."""

from __future__ import annotations

from emulator.run.metrics import TagSummary
from emulator.study.metrics import StudyMetrics, slowdown, sparse_feedback

SAME = 0.03  # variants closer than this finish "the same": the seeds of one variant vary about as much
SHORTER = 0.5  # a standing (p50) queue at most half another's is worth naming


def answer(metrics: StudyMetrics) -> str:
    groups = metrics.groups or {"": list(metrics.variants)}
    if len(groups) == 1:
        [names] = groups.values()
        sentence = _clause(metrics, names) + _queues(metrics, names) + _busiest(metrics, names)
    else:  # variants on different traffic are compared within their traffic only
        sentence = "; ".join(f"on {label}: {_clause(metrics, names)}{_queues(metrics, names, ', ')}"
                             f"{_busiest(metrics, names, ', ')}" for label, names in groups.items())
    if metrics.focus:  # the question is about this traffic: its clause comes first
        sentence = f"{_focus(metrics)}; all traffic: {sentence}"
    lost = sorted(name for name, v in metrics.variants.items() if v.lost_messages)
    if lost:
        sentence += f"; {', '.join(lost)} lost messages"
    if metrics.incomplete:
        sentence += f" - from an incomplete study ({metrics.incomplete})"
    if metrics.fidelity and metrics.fidelity.cpu_bound or any(r.fidelity and r.fidelity.cpu_bound
                                                               for _, r in metrics.runs()):
        sentence += " - but some runs were CPU-bound, so this understates the fabric"
    elif metrics.fidelity and metrics.fidelity.unfaithful or any(r.fidelity and r.fidelity.unfaithful
                                                                  for _, r in metrics.runs()):
        sentence += " - but some runs were UNFAITHFUL (a link backlogged below its rate, or packets lost where no " \
                    "counter says), so this is not the fabric's answer"
    sparse = sparse_feedback(metrics.runs())
    if sparse:
        sentence += f" - and {', '.join(sparse)} saw their queues too rarely to settle them (SPARSE FEEDBACK)"
    return sentence


def _queues(metrics: StudyMetrics, names: list[str], sep: str = "; ") -> str:
    """Whose standing queue (p50 of the backlogged samples) was shortest among `names`, where it was at most
    SHORTER of the deepest; with both p99s (a short run's p99 is its start, where every sender begins at once)."""
    v = {name: metrics.variants[name] for name in names if metrics.variants[name].queue_p50_bytes}
    if len(v) < 2:
        return ""
    short, deep = min(v, key=lambda n: v[n].queue_p50_bytes), max(v, key=lambda n: v[n].queue_p50_bytes)
    if v[short].queue_p50_bytes > SHORTER * v[deep].queue_p50_bytes:
        return ""
    sizes = {n: f"p50 {kib(v[n].queue_p50_bytes)} KiB, p99 {kib(v[n].queue_p99_bytes)} KiB" for n in (short, deep)}
    return f"{sep}{short} kept the shortest queue ({sizes[short]}, against {sizes[deep]} under {deep})"


def kib(size: float | None) -> str:
    """Bytes in KiB, a decimal below 10 (a sprayed fabric's standing queue is a few hundred bytes: not 0)."""
    if size is None:
        return "-"
    return f"{size / 1024:.1f}" if size < 10 * 1024 else f"{size / 1024:.0f}"


def _clause(metrics: StudyMetrics, names: list[str]) -> str:
    """Which of `names` (variants on the same traffic) finished soonest, by how much, how close to the bound."""
    done = {name: metrics.variants[name] for name in names if metrics.variants[name].completion_s}
    if not done:
        return "no variant delivered all of its messages: there is nothing to compare"
    fast = min(done, key=lambda n: done[n].completion_s or 0.0)
    bound = done[fast].ratio_to_bound
    at_bound = f"{bound:.2f}x its lower bound" if bound else "no lower bound"
    if len(done) == 1:
        return f"{fast} finishes at {at_bound}"
    slow = max(done, key=lambda n: done[n].completion_s or 0.0)
    measured = metrics.ratio(slow, fast)
    median, lo, hi = measured or ((done[slow].completion_s or 0.0) / (done[fast].completion_s or 1.0),) * 3
    if median < 1 + SAME:
        ratios = [v.ratio_to_bound for v in done.values() if v.ratio_to_bound]
        span = f", each at {min(ratios):.2f}-{max(ratios):.2f}x its lower bound" if ratios else ""
        return (f"the variants make no difference here: {', '.join(done)} finish within "
                f"{max(1, round((median - 1) * 100))} % of each other{span}")
    return f"{fast} finishes {median:.2f}x sooner than {slow} ({lo:.2f}-{hi:.2f} over seeds), at {at_bound}"


def _focus(metrics: StudyMetrics) -> str:
    """How much each variant slowed the focus tag's messages against their lower bound alone, worst first (when
    they have none, when each variant was done with them)."""
    slowed = {name: s for name, v in metrics.variants.items()
              if (s := slowdown(v.by_tag.get(metrics.focus, TagSummary()))) is not None}
    if not slowed:  # its messages wait for other traffic (an all-gather after its reduce-scatter): no bound alone
        done = {name: t.completion_s for name, v in metrics.variants.items()
                if (t := v.by_tag.get(metrics.focus)) is not None and t.completion_s}
        if not done:
            return f"the {metrics.focus} traffic never completed"
        order = sorted(done, key=lambda n: -done[n])
        return (f"the {metrics.focus} traffic is done at " + ", ".join(f"{done[n]:.2f} s under {n}" for n in order)
                + " (it waits for other traffic: no bound alone)")
    order = sorted(slowed, key=lambda n: -slowed[n])
    if slowed[order[0]] < (1 + SAME) * slowed[order[-1]]:
        return f"the {metrics.focus} traffic takes {slowed[order[-1]]:.2f}x its lower bound alone under every variant"
    return (f"the {metrics.focus} traffic takes, against its lower bound alone, "
            + ", ".join(f"{slowed[n]:.2f}x under {n}" for n in order))


def _busiest(metrics: StudyMetrics, names: list[str], sep: str = "; ") -> str:
    """Which kind of link the busiest one was in the runs of `names` (the job records it), where most agree."""
    kinds = [r.fidelity.busiest_links[0].get("kind") for name, r in metrics.runs()
             if name in names and r.fidelity and r.fidelity.busiest_links]
    kinds = [k for k in kinds if k]
    if not kinds:
        return ""
    top = max(set(kinds), key=kinds.count)
    share = f"in {kinds.count(top)} of {len(kinds)} runs"
    if top == "host":
        return f"{sep}the busiest link was a host's own NIC link {share}, which no routing relieves"
    return f"{sep}the busiest link was a {top} link {share}"

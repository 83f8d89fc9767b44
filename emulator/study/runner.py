"""Studies: every variant of a scenario on a fresh fabric with the same traffic, once per seed, and the answer
in one directory (the resolved scenario, metrics.json, per-run time series, plots and an HTML report).

The seed fixes everything random: the traffic (permutations, expert choice), the controller's hash bases and
the transport's entropy starts. Each run is a traffic job (emulator.run.job) with the scenario's faults on its
timeline; its completion time is shown beside the lower bound the model gives for the same schedule.
"""

from __future__ import annotations

import csv
import itertools
import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import networkx as nx
from tqdm import tqdm

from controllers.static_paths import save_pattern
from emulator.analysis import bounds, feedback
from emulator.analysis.fidelity import verdict
from emulator.model import schedule
from emulator.model.errors import UserError
from emulator.model.fabric import Fabric
from emulator.model.faults import Fault
from emulator.model.schedule import Message
from emulator.net import faults, features, switchd
from emulator.run import autorate, job
from emulator.run.launch import check_options
from emulator.run.metrics import TagSummary
from emulator.study import report
from emulator.study.answer import answer
from emulator.study.metrics import (
    Comparison,
    OrderingSummary,
    PlaneWindows,
    RunResult,
    StudyFidelity,
    StudyMetrics,
    VariantSummary,
    sparse_feedback,
)
from emulator.study.scenario import Scenario, TrafficItem, Variant, variant_fabric
from traffic import patterns, traces


def traffic_item(item: TrafficItem, fabric: Fabric, seed: int) -> list[Message]:
    """One traffic item's messages; patterns that take a seed get the run's unless the scenario fixed one."""
    if item.pattern is not None:
        messages = patterns.generate(item.pattern, fabric, seed=seed, **item.params)
    else:
        messages, _ = traces.load_messages(item.trace, fabric, item.format, comm_groups=item.comm_groups)
    return [replace(m, start_s=m.start_s + item.start_s) for m in messages]


def build_schedule(scenario: Scenario, fabric: Fabric, seed: int,
                   items: tuple[int, ...] | None = None) -> list[Message]:
    """The scenario's traffic (or the items numbered `items`) mixed into one schedule, bytes scaled by its
    traffic_scale."""
    chosen = [item for i, item in enumerate(scenario.traffic) if items is None or i in items]
    messages = patterns.mix(*(traffic_item(item, fabric, seed) for item in chosen))
    if scenario.traffic_scale != 1.0:
        messages = schedule.scaled(messages, scenario.traffic_scale)
    return schedule.check(messages, fabric.hosts())


def static_pattern(fabric: Fabric, messages: list[Message], directory: Path) -> dict[str, str]:
    """The static app's pattern: every host pair of the schedule, balanced over the spines where a permutation
    cannot be collision-free."""
    pairs = sorted({(m.src, m.dst) for m in messages})
    return {"MPFT_PATTERN": str(save_pattern(directory / "pattern.json", pairs, balanced=True))}


def run_once(scenario: Scenario, variant: Variant, fabric: Fabric, messages: list[Message], seed: int,
             outdir: Path, quiet: bool, predicted: dict | None = None) -> RunResult:
    """One variant at one seed: a job on a fresh fabric, and its completion beside the model's lower bound."""
    rundir = outdir / f"{variant.name}-seed{seed}"
    rundir.mkdir(parents=True, exist_ok=True)
    app_env = static_pattern(fabric, messages, rundir) if variant.app == "static" else {}
    m = job.run_job(fabric, messages, rundir, app=variant.app, options=variant.options, seed=seed,
                    timeout_s=scenario.timeout_s, quiet=quiet, app_env=app_env,
                    timeline=[(f.at_s, faults.action(f)) for f in scenario.faults], capture=scenario.capture,
                    controller=scenario.controller or None, servers=list(scenario.servers) or None,
                    ssh_config=scenario.ssh_config, predicted=predicted)
    label_csvs(rundir, variant.name, seed)
    bounded = bound_fabric(fabric, scenario.faults)
    transport = variant.options.transport
    bound = bounds.lower_bound_s(bounded, messages, transport=transport)
    completion = m.completion_s if m.lost_messages == 0 else None
    by_tag = tag_metrics(m.by_tag, tag_bounds(bounded, messages, transport) if len(m.by_tag) > 1 else {})
    return RunResult(seed=seed, dir=rundir.name, completion_s=completion, goodput_bps=m.goodput_bps,
                     lower_bound_s=bound, lost_messages=m.lost_messages,
                     ratio_to_bound=completion / bound if completion and bound else None,
                     message_p99_s=m.message_completion_s.get("p99"),
                     out_of_order_fraction=m.reordering.fraction, retransmits=m.packets.retransmits,
                     by_tag=by_tag, events=m.events, queues=m.queues,
                     planes=plane_windows(fabric, m.plane_mbps, scenario.faults, m.completion_s),
                     ordering=m.ordering, fidelity=m.fidelity, pauses=m.pauses.get("events", 0),
                     paused_s=m.pauses.get("paused_s", 0.0))


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["variant", "seed"])
        writer.writeheader()
        writer.writerows(rows)


def label_csvs(rundir: Path, variant: str, seed: int) -> None:
    """A run's CSVs get `variant` and `seed` as their first columns, so a study's can be concatenated as they are."""
    for path in sorted(rundir.glob("*.csv")):
        with path.open(newline="") as f:
            rows = list(csv.reader(f))
        if not rows or rows[0][:2] == ["variant", "seed"]:
            continue
        with path.open("w", newline="") as f:
            csv.writer(f).writerows([["variant", "seed", *rows[0]], *([variant, seed, *r] for r in rows[1:])])


def bound_fabric(fabric: Fabric, faults: tuple[Fault, ...]) -> Fabric:
    """The fabric the lower bound holds on: links degraded from the start (at_s 0) and never restored run at
    their lowered rate throughout. Any later or restored fault counts at the full rate, which can only lower the
    bound: it holds for every run either way."""
    if any(f.action == "restore" for f in faults):
        return fabric
    slowed = [f for f in faults if f.action == "degrade_link" and f.at_s == 0]
    if not slowed:
        return fabric
    out = fabric.copy()
    for f in slowed:
        out.degrade(*f.link, f.rate_fraction, f.direction)
    return out


def tag_metrics(by_tag: dict[str, TagSummary], alone: dict[str, float | None]) -> dict[str, TagSummary]:
    """Per traffic tag, from the run's: a tag that lost messages has no completion time; `alone` gives the
    lower bound of each tag's messages by themselves."""
    return {tag: replace(t, completion_s=t.completion_s if not t.lost else None, lower_bound_s=alone.get(tag))
            for tag, t in sorted(by_tag.items())}


def tag_bounds(fabric: Fabric, messages: list[Message], transport: str = "rdma") -> dict[str, float | None]:
    """The lower bound of each tag's messages alone on the fabric (None for a tag that waits on another's)."""
    by_tag: dict[str, list[Message]] = {}
    for m in messages:
        by_tag.setdefault(m.tag, []).append(m)
    out: dict[str, float | None] = {}
    for tag, own in by_tag.items():
        ids = {m.id for m in own}
        waits = any(d not in ids for m in own for d in m.deps)
        out[tag] = None if waits else bounds.lower_bound_s(fabric, own, transport=transport)
    return out


def plane_windows(fabric: Fabric, series: dict[int, list[tuple[float, float]]], faults: tuple[Fault, ...],
                  completion_s: float | None) -> PlaneWindows | None:
    """With faults: every plane's forwarded rate (`series`: Mbit/s per sample, as emulator.run.job measures it)
    before the first fault, until the restore (or the end), and after it; and for a plane with a failure, how long
    after the fault its rate stayed below half of what it was before (sample resolution: the sampler's)."""
    if not faults:
        return None
    first = min(f.at_s for f in faults)
    restore = min((f.at_s for f in faults if f.action == "restore"), default=None)
    end = completion_s or float("inf")
    windows = {"before": (0.0, first), "during": (first, restore if restore is not None else end),
               "after": (restore, end) if restore is not None else None}
    out = PlaneWindows()
    for plane, points in sorted(series.items()):
        out.planes[plane] = {name: _mean([v for t, v in points if w[0] < t <= w[1]]) if w else None
                             for name, w in windows.items()}
    for plane in {_fault_plane(fabric, f) for f in faults if f.action.startswith("fail_")}:  # not a slowed link
        before = out.planes.get(plane, {}).get("before") or 0.0
        after = [(t, v) for t, v in series.get(plane, []) if t > first]
        back = next((t for t, v in after if v >= 0.5 * before), None)
        out.recovery_s[plane] = back - first if back is not None else None
    return out


def _fault_plane(fabric: Fabric, fault: Fault) -> int:
    return fault.plane if fault.plane is not None else fabric.node(fault.switch or fault.link[0])["plane"]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _range(values: list) -> list | None:
    values = [v for v in values if v is not None]
    return [min(values), max(values)] if values else None


def summarise_variant(rs: list[RunResult]) -> VariantSummary:
    """Medians over seeds (sums for counts), and what some studies ask beyond completion: per-tag times, queue
    depth, ordering cost, failure recovery."""
    v = VariantSummary(**{key: _median([getattr(r, key) for r in rs])
                          for key in ("completion_s", "goodput_bps", "lower_bound_s", "ratio_to_bound",
                                      "message_p99_s", "out_of_order_fraction")},
                       lost_messages=sum(r.lost_messages for r in rs), retransmits=sum(r.retransmits for r in rs),
                       range={key: _range([getattr(r, key) for r in rs]) for key in ("completion_s",
                                                                                     "ratio_to_bound")},
                       runs=rs)
    none = TagSummary()
    for tag in sorted({tag for r in rs for tag in r.by_tag}):
        tags = [r.by_tag.get(tag, none) for r in rs]
        v.by_tag[tag] = TagSummary(messages=sum(t.messages for t in tags), lost=sum(t.lost for t in tags),
                                   completion_s=_median([t.completion_s for t in tags]),
                                   message_p99_s=_median([t.message_p99_s for t in tags]),
                                   lower_bound_s=_median([t.lower_bound_s for t in tags]))
    if any(r.pauses for r in rs):
        v.pauses = _median([r.pauses for r in rs])
        v.paused_s = _median([r.paused_s for r in rs])
    if any(r.queues for r in rs):
        v.queue_max_bytes = max(r.queues["max_bytes"] for r in rs)
        v.queue_p50_bytes = _median([r.queues.get("p50_bytes", 0.0) for r in rs])
        v.queue_p99_bytes = _median([r.queues["p99_bytes"] for r in rs])
    orderings = [r.ordering for r in rs if r.ordering]
    if orderings:
        v.ordering = OrderingSummary(mode=orderings[0].mode, violations=sum(o.violations for o in orderings),
                                     sends=sum(o.sends for o in orderings),
                                     flag_wait_us_p99=_median([o.flag_wait_us.get("p99") for o in orderings]),
                                     fence_wait_us_p99=_median([o.fence_wait_us.get("p99") for o in orderings]))
    planes = [r.planes for r in rs if r.planes]
    if planes:
        failed = sorted({p for w in planes for p in w.recovery_s})
        v.recovery_s = {str(p): _median([w.recovery_s.get(p) for w in planes]) for p in failed}
        v.plane_mbps = {str(p): {k: _median([w.planes.get(p, {}).get(k) for w in planes])
                                 for k in ("before", "during", "after")}
                        for p in sorted({p for w in planes for p in w.planes})}
    return v


def traffic_groups(scenario: Scenario, names: list[str]) -> dict[str, list[str]]:
    """The variants `names` by the traffic they run: variants whose [[traffic]] items overlap are compared (a
    storage-only, a compute-only and a both variant are one group), variants on disjoint traffic are not. Each
    group is labelled by its items' patterns (or trace files)."""
    variants = {v.name: v for v in scenario.variants}
    every = range(len(scenario.traffic))
    items = {name: set(every if variants[name].traffic is None else variants[name].traffic) for name in names}
    overlap = nx.Graph()
    overlap.add_nodes_from(names)
    overlap.add_edges_from((a, b) for a, b in itertools.combinations(names, 2) if items[a] & items[b])
    out = {}
    for members in sorted((sorted(c, key=names.index) for c in nx.connected_components(overlap)),
                          key=lambda group: names.index(group[0])):
        chosen = set().union(*(items[name] for name in members))
        label = " + ".join(t.pattern or (t.trace.name if t.trace else "trace")
                           for i, t in enumerate(scenario.traffic) if i in chosen)
        out[label] = members
    return out


def summarise(scenario: Scenario, seeds: list[int], runs: dict[str, list[RunResult]],
              skipped: dict[str, str] | None = None, incomplete: str = "") -> StudyMetrics:
    """metrics.json: every variant's summary, completion-time ratios between variants per seed, and the
    fidelity verdict over every run (`incomplete`: why some runs are missing)."""
    comparisons = {}
    groups = traffic_groups(scenario, list(runs))
    for names in groups.values():
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                by_seed = {r.seed: r for r in runs[b]}  # a stopped study may lack b's run of a seed
                ratios = [ra.completion_s / by_seed[ra.seed].completion_s for ra in runs[a]
                          if ra.seed in by_seed and ra.completion_s and by_seed[ra.seed].completion_s]
                if ratios:
                    comparisons[f"{a}/{b}"] = Comparison(median=statistics.median(ratios),
                                                         range=[min(ratios), max(ratios)])
    every = [r.fidelity for rs in runs.values() for r in rs]
    ratios = [f.rate_ratio for f in every if f.rate_ratio is not None]
    fidelity = StudyFidelity(cpu_bound=any(f.cpu_bound for f in every), unfaithful=any(f.unfaithful for f in every),
                             rate_ratio=min(ratios) if ratios else None,
                             cpu_idle=min(f.cpu_idle for f in every),
                             timer_lateness_us_p99=max(f.timer_lateness_us_p99 for f in every))
    fidelity.verdict = verdict([r.dir for rs in runs.values() for r in rs if r.fidelity.cpu_bound],
                               fidelity.cpu_idle, rate_ratio=fidelity.rate_ratio,
                               timer_lateness_us_p99=fidelity.timer_lateness_us_p99,
                               unfaithful_in=[r.dir for rs in runs.values() for r in rs if r.fidelity.unfaithful],
                               scope=" in any run" + (f" on any of its {len(scenario.servers)} servers"
                                                      if scenario.servers else ""))
    fidelity.verdict += _sparse_feedback(runs)
    metrics = StudyMetrics(scenario=scenario.name, question=scenario.question, seeds=seeds,
                           variants={name: summarise_variant(rs) for name, rs in runs.items()},
                           comparisons=comparisons, groups=groups if len(groups) > 1 else {}, fidelity=fidelity,
                           skipped=skipped or {}, focus=scenario.focus, incomplete=incomplete)
    metrics.answer = answer(metrics)
    return metrics


def _sparse_feedback(runs: dict[str, list[RunResult]]) -> str:
    """The verdict's clause naming the variants whose senders saw their queues too rarely to settle them."""
    sparse = sparse_feedback((name, r) for name, rs in runs.items() for r in rs)
    if not sparse:
        return ""
    return (f"; SPARSE FEEDBACK under {', '.join(sparse)}: each sender sees the queue it shares "
            f"{min(sparse.values()):.1f} times per drain {feedback.needs('mtu', 'queue_kb', 'cc pull')}")


@dataclass
class Plan:
    """A study checked against this machine and ready to run: the variants it can run (and why any optional one
    was left out), each variant's fabric (rebuilt at the rate link_mbps = "auto" chose), each run's schedule and,
    with auto, its CPU prediction."""

    scenario: Scenario
    seeds: list[int]
    skipped: dict[str, str]
    fabrics: dict[str, Fabric]
    schedules: dict[tuple[str, int], list[Message]]
    predictions: dict[tuple[str, int], dict]


def prepare(scenario: Scenario, seeds: list[int], quiet: bool = False) -> Plan:
    """Every check that needs more than the file (emulator.study.scenario.parse checked that), in one pass before
    anything starts: what this machine offers (runnable), every run's schedule on its fabric, the focus tag, and
    link_mbps = "auto"'s rate."""
    scenario, skipped = runnable(scenario)
    for name, reason in skipped.items():
        print(f"{scenario.name}: skipping variant {name} on this machine: {reason}")
    fabrics = dict(scenario.fabrics)
    # Variants on the same traffic run the same schedule, drawn on the fabric of the first of them (so that
    # fabrics can be compared on it)
    names = [v.name for v in scenario.variants]
    first = {name: fabrics[group[0]] for group in traffic_groups(scenario, names).values() for name in group}
    schedules = {(v.name, seed): build_schedule(scenario, first[v.name], seed, v.traffic)
                 for v in scenario.variants for seed in seeds}
    tags = {m.tag for messages in schedules.values() for m in messages}
    if scenario.focus and scenario.focus not in tags:
        raise UserError(f"no traffic is tagged {scenario.focus!r} (its tags: {', '.join(sorted(tags))})",
                        file=scenario.source, field="focus")
    for variant in scenario.variants[1:]:
        hosts = fabrics[variant.name].hosts()
        for seed in seeds:
            try:
                schedule.check(schedules[variant.name, seed], hosts)
            except UserError as exc:
                raise UserError(f"the traffic does not fit this variant's fabric: {exc.message}",
                                file=scenario.source, field=f"variants.{variant.name}.topology") from None
    predictions = auto_rate(scenario, fabrics, schedules, seeds, quiet)
    return Plan(scenario, seeds, skipped, fabrics, schedules, predictions)


def runnable(scenario: Scenario) -> tuple[Scenario, dict[str, str]]:
    """What this machine must offer, checked before anything starts: the scenario without the optional variants
    it cannot run, and why each was left out; a variant that is not optional and cannot run, or a fault it cannot
    make, is an error."""
    keep, skipped = [], {}
    for variant in scenario.variants:
        fabric = scenario.fabrics[variant.name]
        try:
            features.check_link_options(fabric, features.detect())
            check_options(variant.options, fabric)
            keep.append(variant)
        except UserError as exc:
            if not variant.optional:
                raise UserError(exc.message, file=scenario.source, field=f"variants.{variant.name}.{exc.field}") \
                    from None
            skipped[variant.name] = exc.message
    kept = replace(scenario, variants=tuple(keep))
    check_faults(kept, features.default_datapath(), switchd.default_mode())
    return kept, skipped


def check_faults(scenario: Scenario, datapath: str, daemons: str) -> None:
    """fail_plane freezes a plane's switch daemon: each variant needs one of its own per plane, under this
    machine's `datapath` and switch daemon layout (`daemons`: emulator.net.switchd.MODES)."""
    for i, fault in enumerate(scenario.faults):
        if fault.action != "fail_plane":
            continue
        if datapath == "kernel":
            raise scenario.error(("faults", i, "plane"), switchd.NO_DAEMON_TO_FREEZE)
        for variant in scenario.variants:
            fabric = scenario.fabrics[variant.name]
            mode = switchd.resolve_mode(fabric, daemons, datapath)
            if mode != "per-plane":
                raise scenario.error(("faults", i, "plane"),
                                     f"fail_plane needs a switch daemon per plane, and variant {variant.name} would "
                                     f"run its {len(fabric.planes)} planes on {mode} daemons here (set "
                                     "MPFT_SWITCH_DAEMONS=per-plane)")


def auto_rate(scenario: Scenario, fabrics: dict[str, Fabric], schedules: dict[tuple[str, int], list[Message]],
              seeds: list[int], quiet: bool, costs: autorate.Costs | None = None) -> dict[tuple[str, int], dict]:
    """With link_mbps = "auto": the variants that ask for it get one rate, the highest at which every one of them
    fits at every seed (so that they compare at one rate), said in one line; their fabrics are rebuilt at it in
    `fabrics`. Returns each such run's prediction, for run_job to set beside what the run used."""
    auto = {v.name: (v, v.options.concrete_cc().cc) for v in scenario.variants
            if v.topology.get("link_mbps") == "auto"}
    if not auto:
        return {}
    costs = costs or autorate.load_costs().with_free_cores()  # the cores other work leaves, measured now
    rates = []
    for name, (v, cc) in auto.items():
        for seed in seeds:
            try:
                rates.append(autorate.choose(lambda mbps, v=v: variant_fabric(v.topology, mbps),
                                             schedules[name, seed], cc, costs).mbps)
            except UserError as refused:
                raise UserError(refused.message, file=scenario.source,
                                field=f"variants.{name}.topology.link_mbps") from None
    mbps = min(rates)
    predictions = {}
    for name, (v, cc) in auto.items():
        fabrics[name] = fabric = variant_fabric(v.topology, mbps)
        for seed in seeds:
            messages = schedules[name, seed]
            predictions[name, seed] = autorate.as_record(autorate.predict(
                fabric, messages, autorate.load_of(fabric, messages, cc, costs), costs, mbps=mbps))
    worst = max(predictions.values(), key=lambda p: p["share"])
    if not quiet:
        print(f"{scenario.name}: link_mbps auto: {mbps:g} Mbit/s for {', '.join(auto)}, the highest at which each "
              f"fits at every seed: predicted at most {worst['cores']:.2f} of {worst['machine']:g} cores "
              f"({worst['share']:.0%}; {worst['source']} costs)")
    return predictions


def run_study(scenario: Scenario, outdir: Path, seeds: list[int] | None = None,
              quiet: bool = False) -> StudyMetrics:
    """Run every variant for every seed; write and return metrics.json, then the report."""
    plan = prepare(scenario, list(seeds or scenario.seeds), quiet)
    scenario, seeds, skipped = plan.scenario, plan.seeds, plan.skipped
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "scenario.json").write_text(json.dumps({**scenario.to_dict(), "seeds": seeds}, indent=2))
    runs: dict[str, list[RunResult]] = {v.name: [] for v in scenario.variants}
    total = len(seeds) * len(scenario.variants)
    with tqdm(total=total, desc=scenario.name, unit="run", disable=quiet) as bar:
        try:
            for seed in seeds:
                for variant in scenario.variants:
                    bar.set_postfix_str(f"{variant.name} seed {seed}")
                    runs[variant.name].append(run_once(scenario, variant, plan.fabrics[variant.name],
                                                       plan.schedules[variant.name, seed], seed, outdir, quiet=True,
                                                       predicted=plan.predictions.get((variant.name, seed))))
                    bar.update()
        except BaseException as exc:  # a failing variant, Ctrl-C, SIGTERM: keep what finished, then go on failing
            done = sum(map(len, runs.values()))
            if done:
                why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                try:
                    finish(scenario, seeds, runs, skipped, outdir, f"stopped after {done} of {total} runs: {why}")
                except Exception as failed:  # the original failure is the one to report
                    print(f"{scenario.name}: could not write the finished runs' results: {failed}")
            raise
    return finish(scenario, seeds, runs, skipped, outdir)


def finish(scenario: Scenario, seeds: list[int], runs: dict[str, list[RunResult]], skipped: dict[str, str],
           outdir: Path, incomplete: str = "") -> StudyMetrics:
    """metrics.json, runs.csv and the report, of every run (or of the runs that finished, marked incomplete)."""
    runs = {name: rs for name, rs in runs.items() if rs}
    metrics = summarise(scenario, seeds, runs, skipped, incomplete)
    metrics.save(outdir / "metrics.json")
    write_csv(outdir / "runs.csv", metrics.run_rows())
    report.write_report(outdir)
    return metrics

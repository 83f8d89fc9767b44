"""Unit tier: what a study does without a network: its schedule from the scenario (seeded, shifted, scaled),
fault actions, and metrics.json from run records (medians, ranges, ratios per seed, the fidelity verdict)."""

from __future__ import annotations

import inspect
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from emulator.analysis import bounds
from emulator.model import topologies
from emulator.model.faults import FAULTS, Fault
from emulator.model.records import from_dict
from emulator.net import faults
from emulator.net.emulation import Emulation
from emulator.net.monitor import LinkSampler
from emulator.run.launch import tag_summary
from emulator.study import runner as study
from emulator.study import scenario
from emulator.study.metrics import RunResult, StudyMetrics
from traffic import patterns

SCENARIO = """
name = "t"
seeds = [1, 2]
[topology]
planes = 2
nodes = 4
leaves = 2
spines = 2
[[traffic]]
pattern = "permutation"
params = { size = 100000 }
[[traffic]]
pattern = "incast"
params = { senders = 2, size = 5000 }
start_s = 0.5
[[variants]]
name = "a"
app = "ecmp"
[[variants]]
name = "b"
app = "spray"
entropy = "spray"
[[faults]]
at_s = 1.0
action = "fail_link"
link = ["p0l0", "p0s1"]
[[faults]]
at_s = 2.0
action = "restore"
[quick]
traffic_scale = 0.1
"""


def _load(quick: bool = False) -> scenario.Scenario:
    return scenario.parse(SCENARIO, "t.toml", Path("."), quick=quick)


def test_schedule_mixes_items_shifts_them_and_follows_the_seed():
    s = _load()
    fabric = topologies.build(**s.variants[0].topology)
    one, again, other = (study.build_schedule(s, fabric, seed) for seed in (1, 1, 2))
    assert one == again and one != other  # the random permutation follows the seed
    incast = [m for m in one if m.tag.startswith("incast")]
    assert incast and all(m.start_s >= 0.5 for m in incast)
    assert [m.id for m in one] == list(range(len(one)))


def test_quick_scales_every_message():
    fabric = topologies.build(**_load().variants[0].topology)
    full, quick = study.build_schedule(_load(), fabric, 1), study.build_schedule(_load(True), fabric, 1)
    assert [max(1, round(m.bytes * 0.1)) for m in full] == [m.bytes for m in quick]


def test_fault_actions_name_what_they_do():
    names = [faults.action(f).__name__ for f in _load().faults]
    assert names == ["fail_link p0l0 p0s1", "restore"]
    slow = Fault(1.0, "degrade_link", ("p0l0", "p0s0"), None, rate_fraction=0.25, direction="a_to_b")
    assert faults.action(slow).__name__ == "degrade_link p0l0 p0s0 0.25 a_to_b"


def _run(seed: int, completion: float | None, bound: float = 1.0, cpu_bound: bool = False,
         lost: int = 0) -> RunResult:
    return from_dict(RunResult, {
            "seed": seed, "dir": f"x-seed{seed}", "completion_s": completion, "goodput_bps": 1e6,
            "lower_bound_s": bound, "lost_messages": lost,
            "ratio_to_bound": completion / bound if completion else None, "message_p99_s": 0.1,
            "out_of_order_fraction": 0.0, "retransmits": 1, "by_tag": {}, "events": [],
            "fidelity": {"cpu_bound": cpu_bound, "rate_ratio": 0.98, "rate_ratio_busiest": 1.0, "cpu_idle": 0.3,
                         "timer_lateness_us_p99": 2000.0, "verdict": "-"}})


def test_summary_takes_medians_ranges_and_per_seed_ratios():
    m = study.summarise(_load(), [1, 2, 3], {"a": [_run(1, 2.0), _run(2, 3.0), _run(3, 4.0)],
                                             "b": [_run(1, 1.0), _run(2, 1.5), _run(3, 4.0)]}).to_dict()
    assert m["variants"]["a"]["completion_s"] == 3.0 and m["variants"]["a"]["range"]["completion_s"] == [2.0, 4.0]
    assert m["variants"]["b"]["ratio_to_bound"] == 1.5
    assert m["variants"]["a"]["retransmits"] == 3
    assert m["comparisons"]["a/b"] == {"median": 2.0, "range": [1.0, 2.0]}  # per seed: 2.0, 2.0, 1.0
    assert m["fidelity"]["cpu_bound"] is False and m["fidelity"]["verdict"].startswith("not CPU-bound")


def test_a_cpu_bound_run_or_a_lost_message_shows():
    m = study.summarise(_load(), [1, 2], {"a": [_run(1, 2.0), _run(2, None, lost=3)],
                                          "b": [_run(1, 1.0, cpu_bound=True), _run(2, 1.0)]}).to_dict()
    assert m["variants"]["a"]["lost_messages"] == 3 and m["variants"]["a"]["completion_s"] == 2.0
    assert m["comparisons"]["a/b"]["range"] == [2.0, 2.0]  # seed 2 has no completion for a
    assert m["fidelity"]["cpu_bound"] is True and m["fidelity"]["verdict"].startswith("CPU-BOUND in x-seed1")


def test_a_stopped_study_compares_the_seeds_both_variants_finished_and_says_it_is_incomplete():
    m = study.summarise(_load(), [1, 2], {"a": [_run(1, 2.0), _run(2, 4.0)], "b": [_run(1, 1.0)]},
                        incomplete="stopped after 3 of 4 runs: interrupted")
    assert m.comparisons["a/b"].median == 2.0 and m.comparisons["a/b"].range == [2.0, 2.0]  # seed 1 only
    assert m.incomplete.startswith("stopped after 3 of 4") and "incomplete study" in m.answer


@pytest.mark.parametrize("name", scenario.builtin_names())
def test_every_builtin_study_builds_its_schedules_on_every_variant(name):
    s = scenario.load(name, quick=True)
    fabric = topologies.build(**s.variants[0].topology)
    messages = study.build_schedule(s, fabric, s.seeds[0])
    assert messages
    for v in s.variants:
        hosts = set(topologies.build(**v.topology).hosts())
        assert {m.src for m in messages} | {m.dst for m in messages} <= hosts


def test_plane_windows_and_recovery_from_the_time_series():
    """Plane 0 forwards 10 Mbit/s on one port until the fault at 1 s, nothing for 0.4 s, then 10 again; plane 1
    is steady at 5 Mbit/s throughout (as the link sampler of emulator.run.job records them)."""
    s = _load()
    fabric = topologies.build(**s.variants[0].topology)
    p0 = fabric.intf("p0l0", "p0s0")
    sampler = LinkSampler(fabric)
    for i in range(1, 16):
        t = round(i * 0.2, 1)
        sampler.planes.setdefault(0, []).append((t, 0.0 if 5 < i <= 7 else 10.0))  # silent at 1.2 and 1.4 s
        sampler.planes.setdefault(1, []).append((t, 5.0))
        sampler.rows.append((t, "queue_bytes", p0, 1000 * i))
    w = study.plane_windows(fabric, sampler.plane_mbps(), s.faults, 3.0)
    assert w.planes[1] == {"before": 5.0, "during": 5.0, "after": 5.0}
    assert w.planes[0]["before"] == 10.0 and w.planes[0]["during"] < 10.0
    assert w.recovery_s == {0: pytest.approx(0.6)}  # first sample back at >= half: t = 1.6
    assert sampler.queues() == {"max_bytes": 15000.0, "p50_bytes": 8000.0, "p99_bytes": 15000.0, "samples": 15}
    sampler.depths = [500] * 30  # the reads between the link samples join them
    assert sampler.queues()["p50_bytes"] == 500 and sampler.queues()["samples"] == 45
    assert study.plane_windows(fabric, sampler.plane_mbps(), (), 3.0) is None


def test_tag_metrics_from_the_runs_message_rows():
    def row(tag, delivered_s, completion_s):
        return {"tag": tag, "delivered_s": delivered_s, "completion_s": completion_s}
    by_tag = {"x": tag_summary([row("x", 0.5, 0.5), row("x", 0.9, 0.8)]), "y": tag_summary([row("y", None, None)])}
    assert {tag: asdict(t) for tag, t in study.tag_metrics(by_tag, {"x": 0.45}).items()} == {
        "x": {"messages": 2, "lost": 0, "completion_s": 0.9, "message_p99_s": 0.8, "lower_bound_s": 0.45},
        "y": {"messages": 1, "lost": 1, "completion_s": None, "message_p99_s": None, "lower_bound_s": None}}


def test_each_tag_is_bounded_alone_unless_it_waits_on_another():
    fabric = topologies.build("ft2", leaves=2, hosts_per_leaf=2, spines=1)
    flow = patterns.generate("flow", fabric, src="h0", dst="h3", size=1_000_000)
    ring = patterns.generate("ring-allreduce", fabric, size=400_000)
    mixed = patterns.mix(flow, ring)
    waits = [replace(m, deps=(0,)) if m.tag != "flow" and not m.deps else m for m in mixed]
    alone = study.tag_bounds(fabric, mixed)
    assert alone["flow"] == pytest.approx(bounds.lower_bound_s(fabric, flow))
    assert alone["ring-allreduce/reduce-scatter"] is not None
    assert study.tag_bounds(fabric, waits)["ring-allreduce/reduce-scatter"] is None  # it waits on the flow


def test_the_bound_counts_a_link_slowed_for_the_whole_run_only():
    fabric = topologies.build("ft2", k=4)
    slow = Fault(at_s=0.0, action="degrade_link", link=("p0l0", "p0s0"), switch=None, rate_fraction=0.25,
                          direction="a_to_b")
    full = fabric.rate("p0l0", "p0s0")
    degraded = study.bound_fabric(fabric, (slow,))
    assert degraded.rate("p0l0", "p0s0") == full / 4 and degraded.rate("p0s0", "p0l0") == full
    assert not fabric.is_degraded()
    later = Fault(at_s=1.0, action="degrade_link", link=("p0l0", "p0s0"), switch=None, rate_fraction=0.25,
                           direction="both")
    restore = Fault(at_s=2.0, action="restore", link=None, switch=None)
    assert study.bound_fabric(fabric, (later,)) is fabric  # full rate until 1 s: the bound may not assume less
    assert study.bound_fabric(fabric, (slow, restore)) is fabric


def test_every_fault_is_the_emulation_method_of_its_name_taking_its_arguments():
    for action in FAULTS:
        method = getattr(Emulation, action)
        params = list(inspect.signature(method).parameters.values())[1:]
        words = len(Fault(0.0, action, ("p0l0", "p0s0"), "p0s0", 1, 0.5, "both").words()) - 1
        assert sum(p.default is p.empty for p in params) <= words <= len(params), action


def test_variants_are_compared_with_those_whose_traffic_overlaps_theirs():
    storage = scenario.load("storage")  # both = [0, 1], compute-only = [0], storage-only = [1]
    assert list(study.traffic_groups(storage, [v.name for v in storage.variants]).values()) == [
        ["both", "compute-only", "storage-only"]]
    routing = scenario.load("routing")
    groups = study.traffic_groups(routing, [v.name for v in routing.variants])
    assert groups == {"moe + ring-allreduce": ["ecmp", "static", "spray", "adaptive"],
                      "permutation": ["perm-ecmp", "perm-spray", "perm-adaptive"]}


def test_each_csv_of_a_run_gets_the_variant_and_seed_first_once(tmp_path):
    (tmp_path / "messages.csv").write_text("id,src\n0,h0\n1,h1\n")
    study.label_csvs(tmp_path, "spray", 3)
    study.label_csvs(tmp_path, "spray", 3)  # again: nothing more
    assert (tmp_path / "messages.csv").read_text().splitlines() == ["variant,seed,id,src", "spray,3,0,h0",
                                                                    "spray,3,1,h1"]


def test_runs_rows_are_flat_with_fidelity_and_every_tag():
    m = StudyMetrics.from_dict({"variants": {
        "a": {"runs": [{"seed": 1, "dir": "a-seed1", "completion_s": 2.0, "queues": {"max_bytes": 10, "p99_bytes": 9},
                        "by_tag": {"flow": {"completion_s": 1.0, "lower_bound_s": 0.5}},
                        "fidelity": {"cpu_bound": False, "verdict": "not CPU-bound"}}]},
        "b": {"runs": [{"seed": 1, "dir": "b-seed1", "completion_s": 3.0}]}}})
    rows = m.run_rows()
    assert [(r["variant"], r["seed"], r["completion_s"], r["flow:completion_s"]) for r in rows] == [
        ("a", 1, 2.0, 1.0), ("b", 1, 3.0, None)]
    assert rows[0]["queue_p99_bytes"] == 9 and rows[0]["verdict"] == "not CPU-bound" and rows[1]["cpu_bound"] is False
    assert len({tuple(r) for r in rows}) == 1  # the same columns in every row

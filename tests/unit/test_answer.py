"""A study's one-sentence answer (emulator.study.answer) from invented metrics: it names the variant that
finished soonest, by the measured per-seed ratio, says when the variants make no difference, and says when runs
were CPU-bound."""

from __future__ import annotations

from emulator.run.metrics import TagSummary
from emulator.study.answer import answer
from emulator.study.metrics import StudyMetrics


def _metrics(ecmp_s: float, spray_s: float, cpu_bound: bool = False, busiest: tuple[str, ...] = ()) -> StudyMetrics:
    def variant(completion: float) -> dict:
        runs = [{"seed": i + 1, "completion_s": completion,
                 "fidelity": {"busiest_links": [{"intf": "p0l0-eth1", "ratio": 0.99, "kind": kind}]}}
                for i, kind in enumerate(busiest)]
        return {"completion_s": completion, "ratio_to_bound": completion / 1.0, "lower_bound_s": 1.0, "runs": runs}
    ratio = ecmp_s / spray_s
    return StudyMetrics.from_dict({
        "scenario": "s", "question": "does spray beat ecmp?", "seeds": [1, 2, 3],
        "variants": {"ecmp": variant(ecmp_s), "spray": variant(spray_s)},
        "comparisons": {"ecmp/spray": {"median": ratio, "range": [ratio * 0.9, ratio * 1.1]}},
        "fidelity": {"cpu_bound": cpu_bound, "verdict": "CPU-BOUND" if cpu_bound else "not CPU-bound"}})


def test_the_faster_variant_is_named_with_the_measured_ratio():
    assert answer(_metrics(2.4, 1.0)) == \
        "spray finishes 2.40x sooner than ecmp (2.16-2.64 over seeds), at 1.00x its lower bound"


def test_when_ecmp_wins_the_sentence_says_so():
    assert answer(_metrics(1.0, 2.0)) == \
        "ecmp finishes 2.00x sooner than spray (1.82-2.22 over seeds), at 1.00x its lower bound"


def test_variants_within_the_seeds_noise_make_no_difference():
    assert answer(_metrics(1.11, 1.10)) == ("the variants make no difference here: ecmp, spray finish within 1 % "
                                           "of each other, each at 1.10-1.11x its lower bound")


def test_cpu_bound_runs_are_said_to_understate_the_fabric():
    assert answer(_metrics(2.0, 1.0, cpu_bound=True)).endswith("CPU-bound, so this understates the fabric")


def test_the_busiest_links_explain_a_tie():
    said = answer(_metrics(1.10, 1.10, busiest=("host", "host", "fabric")))
    assert said.startswith("the variants make no difference here")
    assert said.endswith("the busiest link was a host's own NIC link in 4 of 6 runs, which no routing relieves")
    assert answer(_metrics(2.0, 1.0, busiest=("fabric",))).endswith("the busiest link was a fabric link in 2 of 2 runs")


def test_variants_on_different_traffic_are_answered_per_traffic():
    m = _metrics(2.0, 1.0)
    both = StudyMetrics.from_dict({**m.to_dict(), "groups": {"permutation": ["ecmp", "spray"], "all-to-all": ["a2a"]},
                                   "variants": {**m.to_dict()["variants"],
                                                "a2a": {"completion_s": 0.5, "ratio_to_bound": 1.2}}})
    assert answer(both) == ("on permutation: spray finishes 2.00x sooner than ecmp (1.80-2.20 over seeds), at 1.00x "
                            "its lower bound; on all-to-all: a2a finishes at 1.20x its lower bound")


def test_a_focus_tag_leads_with_its_slowdown_under_each_variant_worst_first():
    m = _metrics(2.0, 1.0)
    m.focus = "flow"
    m.variants["ecmp"].by_tag["flow"] = TagSummary(messages=1, completion_s=1.5, lower_bound_s=0.5)
    m.variants["spray"].by_tag["flow"] = TagSummary(messages=1, completion_s=0.6, lower_bound_s=0.5)
    assert answer(m).startswith("the flow traffic takes, against its lower bound alone, 3.00x under ecmp, "
                                "1.20x under spray; all traffic: spray finishes 2.00x sooner than ecmp")
    m.variants["ecmp"].by_tag["flow"] = TagSummary(messages=1, completion_s=0.61, lower_bound_s=0.5)
    assert answer(m).startswith("the flow traffic takes 1.20x its lower bound alone under every variant; ")
    for v, done in (("ecmp", 1.5), ("spray", 0.7)):  # traffic that waits for other traffic has no bound alone
        m.variants[v].by_tag["flow"] = TagSummary(messages=1, completion_s=done)
    assert answer(m).startswith("the flow traffic is done at 1.50 s under ecmp, 0.70 s under spray (it waits for "
                                "other traffic: no bound alone); all traffic: ")


def test_the_shortest_queue_is_named_where_queues_differ_and_sparse_feedback_is_said():
    m = _metrics(1.0, 1.05).to_dict()
    for name, p50, p99 in (("ecmp", 7, 30), ("spray", 28, 31)):  # a short run's p99s: its start, alike
        m["variants"][name].update(queue_p50_bytes=p50 * 1024, queue_p99_bytes=p99 * 1024)
    said = answer(StudyMetrics.from_dict(m))
    assert "; ecmp kept the shortest queue (p50 7.0 KiB, p99 30 KiB, against p50 28 KiB, p99 31 KiB under spray)" \
        in said
    m["variants"]["spray"]["queue_p50_bytes"] = 10 * 1024  # not twice as deep: not worth a clause
    assert "shortest queue" not in answer(StudyMetrics.from_dict(m))
    m["variants"]["ecmp"]["runs"] = [{"seed": 1, "completion_s": 1.0, "fidelity": {"feedback_per_drain": 1.2}}]
    assert answer(StudyMetrics.from_dict(m)).endswith(
        " - and ecmp saw their queues too rarely to settle them (SPARSE FEEDBACK)")

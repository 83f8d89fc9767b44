"""Integration tier: the paper's fabric (8 planes of 8 nodes, 64 GPUs, cross-plane traffic over NVLink and PXN) at
the rate --link-mbps auto chooses carries the all-to-all near its bound with every packet accounted for and the
CPU it predicted; at three times that rate the machine no longer carries it, and the verdict says so."""

from __future__ import annotations

import pytest

from emulator.analysis import bounds
from emulator.analysis.fidelity import BUSY_THREAD, IDLE_FLOOR
from emulator.analysis.timeseries import read_timeseries
from emulator.model import topologies
from emulator.net.monitor import OTHER_WORK
from emulator.run import autorate
from emulator.run.job import run_job
from traffic import patterns

pytestmark = pytest.mark.root

PAPER = {"planes": 8, "nodes": 8, "leaves": 2, "spines": 2}
START_S = 3.0  # the all-to-all's start: every host posts to every other at once


def _paper(mbps: float):
    return topologies.build("mpft", link_mbps=mbps, **PAPER)


@pytest.fixture(scope="module")
def costs(tmp_path_factory):
    """This machine's costs, as `mpft doctor --measure` saved them, else measured now (about two minutes): the
    built-in ones are another machine's, and on one whose agents paid 2.75x their CPU per datagram the rate they
    chose was CPU-BOUND."""
    costs = autorate.load_costs()
    return autorate.measure_costs(tmp_path_factory.mktemp("costs")) if costs.source == autorate.BUILT_IN.source \
        else costs


@pytest.fixture(scope="module")
def messages():
    return patterns.all_to_all(_paper(1))


@pytest.fixture(scope="module")
def chosen(costs, messages):
    """The rate auto chooses for the all-to-all (default size), for the cores other work leaves now (beside a busy
    core, the rate two free cores fit was CPU-BOUND: machine idle min 0 %)."""
    return autorate.choose(_paper, messages, "pull", costs.with_free_cores()), messages


def test_the_all_to_all_at_the_auto_rate_is_near_its_bound_and_every_packet_accounted_for(chosen, tmp_path):
    """A run the verdict rejected past its start is asked once more, as test_studies does, and the second must
    hold: in one suite run of three at 1.5 Mbit/s the machine was 7-10 % free in several samples (18 % on
    average; its processes used 64 % of it, predicted 54 %), where the other two were within the limits."""
    prediction, messages = chosen
    fabric = _paper(prediction.mbps)
    m = run_job(fabric, messages, tmp_path, app="spray", quiet=True, predicted=autorate.as_record(prediction))
    if m.fidelity.unfaithful or m.fidelity.cpu_bound and not _saturated_at_start_only(tmp_path):
        tmp_path = tmp_path / "again"
        m = run_job(fabric, messages, tmp_path, app="spray", quiet=True, predicted=autorate.as_record(prediction))
    acc = m.accounting
    assert m.lost_messages == 0
    assert acc["unattributed"] == 0 and acc["sent"] == acc["delivered"] + sum(acc["drops"].values())
    assert not m.fidelity.unfaithful, m.fidelity.verdict
    assert not m.fidelity.cpu_bound or _saturated_at_start_only(tmp_path), m.fidelity.verdict
    assert m.completion_s <= 1.15 * bounds.lower_bound_s(fabric, messages)
    if m.fidelity.cpu_other < OTHER_WORK:  # the costs are an otherwise idle machine's: beside a one-core busy loop
        assert abs(m.cpu_prediction["error"]) <= 0.25, m.cpu_prediction  # the agents took 2.9x their CPU


def _saturated_at_start_only(rundir) -> bool:
    """Every CPU sample that began after the first START_S seconds within the verdict's limits: on a machine whose
    agents pay 2.75x the reference machine's CPU per datagram, the all-to-all's first two seconds left the machine
    3-10 % idle at every rate tried (2, 2.5 and 3 Mbit/s; 20-25 % later, links at their rate, nothing lost at the
    daemons' input). The verdict still calls such a run CPU-BOUND (it does not count); what auto cannot yet foresee
    is the start, not the run (issue 37)."""
    samples = read_timeseries(rundir / "timeseries.csv") or {}

    def after_start(kind: str) -> list[float]:  # a sample's time is its end: the one before it is its start
        return [v for times, values in samples.get(kind, {}).values()
                for began, v in zip(times[:-1], values[1:], strict=True) if began > START_S]
    free = after_start("cpu_free")
    return bool(free) and min(free) >= IDLE_FLOOR and max(after_start("vswitchd_thread") +
                                                          after_start("process_thread"), default=0.0) <= BUSY_THREAD


def test_thrice_the_auto_rate_is_past_what_the_machine_carries_and_the_verdict_says_so(costs, messages, tmp_path):
    """At the first of auto's candidate rates at or above 3x its choice for the whole machine (beside other work
    auto fits the cores that work leaves, and three times that the machine may still carry: beside a one-core busy
    loop, 3 Mbit/s for auto's 1 came out faithful and not CPU-bound, the loop yielding). Where the edge lies
    between is the machine's business, not a behaviour to assert: at 1.6x (8 Mbit/s) most runs here came out
    UNFAITHFUL and a clean-clone CI run on a quieter machine did not (17 % idle, links at their rate, 0
    unattributed): `benchmarks/paper_fabric.py --only "all-to-all 64" --rates 5,8` measures the edge."""
    whole = autorate.choose(_paper, messages, "pull", costs)  # the whole machine's: other work yields it most
    mbps = next(r for r in autorate.RATES if r >= 3 * whole.mbps)
    m = run_job(_paper(mbps), messages, tmp_path, app="spray", quiet=True)
    assert m.fidelity.cpu_bound or m.fidelity.unfaithful, m.fidelity.verdict

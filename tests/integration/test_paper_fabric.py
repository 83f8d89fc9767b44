"""Integration tier: the paper's fabric (8 planes of 8 nodes, 64 GPUs, cross-plane traffic over NVLink and PXN) at
the rate --link-mbps auto chooses carries the all-to-all near its bound with every packet accounted for and the
CPU it predicted; at three times that rate the machine no longer carries it, and the verdict says so."""

from __future__ import annotations

import pytest

from emulator.analysis import bounds
from emulator.model import topologies
from emulator.run import autorate
from emulator.run.job import run_job
from traffic import patterns

pytestmark = pytest.mark.root

PAPER = {"planes": 8, "nodes": 8, "leaves": 2, "spines": 2}


def _paper(mbps: float):
    return topologies.build("mpft", link_mbps=mbps, **PAPER)


@pytest.fixture(scope="module")
def chosen():
    """The rate auto chooses for the all-to-all (default size) with the built-in costs, for the cores other work
    leaves now (beside a busy core, the rate two free cores fit was CPU-BOUND: machine idle min 0 %)."""
    messages = patterns.all_to_all(_paper(1))
    return autorate.choose(_paper, messages, "pull", autorate.BUILT_IN.with_free_cores()), messages


def test_the_all_to_all_at_the_auto_rate_is_near_its_bound_and_every_packet_accounted_for(chosen, tmp_path):
    prediction, messages = chosen
    fabric = _paper(prediction.mbps)
    m = run_job(fabric, messages, tmp_path, app="spray", quiet=True, predicted=autorate.as_record(prediction))
    acc = m.accounting
    assert m.lost_messages == 0
    assert acc["unattributed"] == 0 and acc["sent"] == acc["delivered"] + sum(acc["drops"].values())
    assert not m.fidelity.cpu_bound and not m.fidelity.unfaithful, m.fidelity.verdict
    assert m.completion_s <= 1.15 * bounds.lower_bound_s(fabric, messages)
    assert abs(m.cpu_prediction["error"]) <= 0.25, m.cpu_prediction


def test_thrice_the_auto_rate_is_past_what_the_machine_carries_and_the_verdict_says_so(chosen, tmp_path):
    """At the first of auto's candidate rates at or above 3x its choice (15 Mbit/s for 5). Where the edge lies
    between is the machine's business, not a behaviour to assert: at 1.6x (8 Mbit/s) most runs here came out
    UNFAITHFUL and a clean-clone CI run on a quieter machine did not (17 % idle, links at their rate, 0
    unattributed): `benchmarks/paper_fabric.py --only "all-to-all 64" --rates 5,8` measures the edge."""
    prediction, messages = chosen
    mbps = next(r for r in autorate.RATES if r >= 3 * prediction.mbps)
    m = run_job(_paper(mbps), messages, tmp_path, app="spray", quiet=True)
    assert m.fidelity.cpu_bound or m.fidelity.unfaithful, m.fidelity.verdict

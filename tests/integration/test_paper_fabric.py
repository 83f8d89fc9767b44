"""Integration tier: the paper's fabric (8 planes of 8 nodes, 64 GPUs, cross-plane traffic over NVLink and PXN) at
the rate --link-mbps auto chooses carries the all-to-all near its bound with every packet accounted for and the
CPU it predicted; at 1.5x that rate the machine no longer carries it, and the verdict says so."""

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
    """The rate auto chooses for the all-to-all (default size) with the built-in costs."""
    messages = patterns.all_to_all(_paper(1))
    return autorate.choose(_paper, messages, "pull", autorate.BUILT_IN), messages


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


def test_half_again_the_auto_rate_is_past_what_the_machine_carries(chosen, tmp_path):
    """At the first of auto's candidate rates at or above 1.5x its choice (8 Mbit/s for 5: 1.6x). Exactly 1.5x
    (7.5 Mbit/s) sits on the edge: 1 run in 6 came out not flagged (the daemons held 0.88 packet times, the
    machine 17 % idle at least), the others UNFAITHFUL; at 8 Mbit/s every run measured was."""
    prediction, messages = chosen
    mbps = next(r for r in autorate.RATES if r >= 1.5 * prediction.mbps)
    m = run_job(_paper(mbps), messages, tmp_path, app="spray", quiet=True)
    assert m.fidelity.cpu_bound or m.fidelity.unfaithful, m.fidelity.verdict

"""How often each sender of a shared downlink sees its queue (emulator.analysis.feedback), and where it is said."""

from __future__ import annotations

import pytest

from emulator.analysis import feedback
from emulator.model import topologies
from emulator.model.schedule import Message
from emulator.run.job import _sender_driven
from emulator.run.metrics import Fidelity
from emulator.study.metrics import RunResult
from emulator.study.runner import _sparse_feedback
from traffic.options import TransportOptions


def leaf_spine(mtu: int):
    return topologies.build("ft2", leaves=4, hosts_per_leaf=4, spines=4, mtu=mtu)


def incast(fabric, gap_s: float = 0.0, deps: tuple[int, ...] = ()) -> list[Message]:
    hosts = fabric.hosts()
    return [Message(i, i * gap_s, s, hosts[0], 512_000, deps=deps if i else ()) for i, s in enumerate(hosts[1:])]


def test_a_jumbo_frame_incast_gives_each_sender_one_look_per_drain_and_a_warning():
    f = leaf_spine(9000)
    fb = feedback.sparsest(f, incast(f))
    assert (fb.receiver, fb.senders) == ("h0", 15)
    assert fb.queue_packets == pytest.approx(128 * 1024 / 9014)
    assert fb.per_drain < 1.0
    assert "SPARSE FEEDBACK: 15 senders share h0's downlink" in fb.warning()


def test_standard_frames_give_enough_looks_and_no_warning():
    f = leaf_spine(1500)
    fb = feedback.sparsest(f, incast(f))
    assert fb.per_drain > feedback.ENOUGH
    assert fb.warning() == ""


def test_senders_that_start_a_drain_apart_do_not_share_the_queue():
    f = leaf_spine(9000)
    drain_s = 128 * 1024 * 8 / 10e6
    assert feedback.sparsest(f, incast(f, gap_s=1.01 * drain_s)) is None
    assert feedback.sparsest(f, incast(f, gap_s=0.99 * drain_s / 2)).senders == 3  # within one drain: 3 posts


def test_messages_waiting_on_others_and_nvlink_peers_are_not_counted():
    f = leaf_spine(9000)
    assert feedback.sparsest(f, incast(f, deps=(0,))) is None
    mpft = topologies.build("mpft", planes=4, nodes=4, leaves=4)
    dst = mpft.hosts()[0]
    peers = [h for h in mpft.hosts() if h != dst and mpft.nvlink_peer(h) == mpft.nvlink_peer(dst)]
    others = [h for h in mpft.hosts() if mpft.nvlink_peer(h) != mpft.nvlink_peer(dst)]
    assert len(peers) == 3 and len(others) == 12
    messages = [Message(i, 0.0, s, dst, 100_000) for i, s in enumerate(peers + others)]
    assert feedback.sparsest(mpft, messages).senders == 12


def test_only_sender_driven_rdma_congestion_control_is_warned_about():
    assert [cc for cc in ("none", "rtt", "ecn", "pull", "auto")
            if _sender_driven(TransportOptions(cc=cc))] == ["rtt", "ecn"]
    assert not _sender_driven(TransportOptions(transport="tcp", cc="cubic"))


def test_a_study_names_the_variants_whose_senders_saw_too_little():
    def run(per_drain):
        return RunResult(fidelity=Fidelity(feedback_per_drain=per_drain))
    runs = {"none": [run(None)], "pull": [run(None)], "rtt": [run(0.97), run(0.97)], "ecn": [run(0.97)],
            "rtt-1500": [run(5.8)]}
    said = _sparse_feedback(runs)
    assert said.startswith("; SPARSE FEEDBACK under rtt, ecn: each sender sees the queue it shares 1.0 times")
    assert _sparse_feedback({"rtt-1500": [run(5.8)], "pull": [run(None)]}) == ""


def test_a_marked_queue_settles_when_it_is_back_under_kmin_after_its_first_time_at_kmax():
    kmin, kmax, rest = 30, 60, [40, 50] * 40
    assert feedback.settled([0, 40, 70, 90, 50, 20, 65, 10, *rest], kmin, kmax) == 5  # not at 50, nor the later 65
    assert feedback.settled([0, 20, 50, 40, *rest], kmin, kmax) == 0  # never at kmax: no start to leave out
    assert feedback.settled([10, 80, 90, *rest, 20], kmin, kmax) is None  # back under kmin only at the end

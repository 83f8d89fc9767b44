"""The window and the least RTO left to the fabric (emulator.run.launch), hand-computed: cc none gets the
bandwidth-delay product in packets (at least one, at most a switch queue), a congestion control gets one queue as
its ceiling, the RTO floor is a base round trip plus two full queues' drain, and what the user set is kept."""

from __future__ import annotations

import pytest

from emulator.model import topologies
from traffic.defaults import model_min_rto_ms, model_window
from traffic.options import TransportOptions

QUEUE_PACKETS = 14  # 128 KB // (9000 + 14 bytes)


@pytest.mark.parametrize("topo, params, window", [
    ("mpft", {}, 1),  # 10 Mbit/s x 2 ms / 72,112 bits = 0.28 packets
    ("mpft", {"link_mbps": 100}, 3),  # 2.77 packets
    ("mpft", {"link_mbps": 1000}, QUEUE_PACKETS),  # 27.7 packets: more than a queue holds
    ("ft2", {"leaves": 2, "hosts_per_leaf": 2, "spines": 2, "delay_ms": 5}, 6),  # (2 + 2 x 4 x 5) ms: 5.8
    ("ft3", {"k": 4, "delay_ms": 5}, 9),  # 6 links on the longest path: (2 + 2 x 6 x 5) ms: 8.6
])
def test_cc_none_gets_the_bandwidth_delay_product(topo, params, window):
    assert model_window(topologies.build(topo, **params), "none") == window


def test_a_window_based_congestion_control_gets_one_queue_as_its_ceiling():
    fabric = topologies.build("mpft")
    assert model_window(fabric, "rtt") == model_window(fabric, "pull") == QUEUE_PACKETS
    assert model_window(topologies.build("mpft", queue_kb=32), "rtt") == 3


def test_dcqcn_sets_a_rate_over_the_bandwidth_delay_product():
    fabric = topologies.build("mpft")
    assert model_window(fabric, "ecn") == model_window(fabric, "none") == 1


def test_what_the_user_set_is_kept():
    fabric = topologies.build("mpft")
    assert TransportOptions().window == 0
    assert TransportOptions(cc="none").for_fabric(fabric).window == 1
    assert TransportOptions(cc="rtt").for_fabric(fabric).window == QUEUE_PACKETS
    assert TransportOptions(window=7).for_fabric(fabric).window == 7
    assert TransportOptions(transport="tcp").for_fabric(fabric).window == 0  # kernel TCP has its own


def test_cc_auto_is_pull_with_rdma_and_the_kernels_default_with_tcp():
    fabric = topologies.build("mpft")
    assert TransportOptions().cc == "auto"
    assert TransportOptions().for_fabric(fabric).cc == "pull"
    assert TransportOptions(transport="tcp").for_fabric(fabric).cc == "none"
    assert TransportOptions(cc="rtt").for_fabric(fabric).cc == "rtt"


def test_rtt_starts_at_the_bandwidth_delay_product_under_its_ceiling():
    fabric = topologies.build("mpft", link_mbps=100)
    opts = TransportOptions(cc="rtt").for_fabric(fabric)
    assert (opts.window, opts.cc_params) == (QUEUE_PACKETS, {"initial_window": 3, "base_rtt_ms": 2.0})
    mine = TransportOptions(cc="rtt", cc_params={"initial_window": 5}).for_fabric(fabric)
    assert mine.cc_params == {"initial_window": 5, "base_rtt_ms": 2.0}


def test_pull_grants_one_queue_and_starts_with_the_bandwidth_delay_product():
    opts = TransportOptions(cc="pull").for_fabric(topologies.build("mpft", link_mbps=100))
    assert opts.cc_params == {"grant_limit": QUEUE_PACKETS, "unscheduled": 3}
    mine = TransportOptions(cc="pull", cc_params={"grant_limit": 4}).for_fabric(topologies.build("mpft"))
    assert mine.cc_params == {"grant_limit": 4, "unscheduled": 1}


@pytest.mark.parametrize("nodes, oversubscribed, limit", [(8, 2.0, QUEUE_PACKETS), (16, 4.0, QUEUE_PACKETS // 4)])
def test_pull_grants_a_queue_shared_by_the_hosts_behind_an_oversubscribed_leaf(nodes, oversubscribed, limit):
    # the paper's 8 planes with 2 leaves and 2 spines each: 4 or 8 hosts on a leaf with 2 uplinks
    fabric = topologies.build("mpft", planes=8, nodes=nodes, leaves=2, spines=2)
    assert fabric.oversubscription() == oversubscribed
    opts = TransportOptions(cc="pull").for_fabric(fabric)
    assert (opts.window, opts.cc_params["grant_limit"]) == (QUEUE_PACKETS, limit)


def test_a_storage_planes_shape_leaves_the_gpus_grant_limit_alone():
    # six storage hosts on one uplink: the storage network's own shape, not the GPUs' (pull's limit fell to 1,
    # and a sprayed transfer beside a background flow no longer reordered: test_transport's arrival-order test)
    fabric = topologies.build("mpft", planes=2, nodes=4, leaves=2, spines=2, storage=True, storage_servers=2,
                              storage_leaves=1, storage_spines=1)
    assert fabric.oversubscription() == 1.0
    assert TransportOptions(cc="pull").for_fabric(fabric).cc_params["grant_limit"] == QUEUE_PACKETS


PXN = 104.8576 + 104.8576 / 4  # across planes: a node-mate's NIC queue and the NVLink port's (4x the rate) too


@pytest.mark.parametrize("topo, params, rto_ms", [
    ("ft2", {}, 2 + 2 * 104.8576),  # 131,072 B x 8 / 10 Mbit/s = 104.86 ms per queue
    ("mpft", {}, 2 + 2 * 104.8576 + PXN),
    ("mpft", {"planes": 1}, 2 + 2 * 104.8576),  # one plane: no PXN
    ("mpft", {"link_mbps": 100, "queue_kb": 64}, 2 + (2 * 104.8576 + PXN) / 20),
    ("mpft", {"delay_ms": 5}, 2 + 2 * 4 * 5 + 2 * 104.8576 + PXN),  # four links on the longest path, each way
])
def test_the_least_rto_outlasts_the_full_queues_on_the_longest_path(topo, params, rto_ms):
    assert model_min_rto_ms(topologies.build(topo, **params)) == pytest.approx(rto_ms)


def test_the_least_rto_the_user_set_is_kept():
    fabric = topologies.build("mpft")
    assert TransportOptions().min_rto_ms == 0
    assert TransportOptions().for_fabric(fabric).min_rto_ms == pytest.approx(342.787, abs=1e-3)
    assert TransportOptions(min_rto_ms=20).for_fabric(fabric).min_rto_ms == 20

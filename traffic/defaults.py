"""What the transport takes from the fabric where the user left an option to it (0 or auto): the window, the
least RTO, pull's grant limit and unscheduled packets, rtt's initial window and base RTT, DCQCN's timer and CNP
interval. Pure functions of the fabric model (traffic.options.TransportOptions.for_fabric applies them)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from emulator.model import wire
from emulator.model.naming import TIERS

if TYPE_CHECKING:  # agents read traffic.options, which applies these: they need no networkx
    from emulator.model.fabric import Fabric

BASE_RTT_S = 0.002  # a round trip through idle queues here (agents and userspace switches): 1.6-2.1 ms measured


def slowest_nic_bps(fabric: Fabric) -> float:
    return min(sum(fabric.link(h, leaf)["bps"] for leaf, _ in fabric.nic_links(h)) for h in fabric.hosts())


def base_rtt_s(fabric: Fabric) -> float:
    """BASE_RTT_S plus each link's delay both ways on the longest path."""
    path_links = 2 * max((TIERS.get(fabric.node(s)["role"], 1) for s in fabric.switches()), default=1)
    return BASE_RTT_S + 2 * path_links * fabric.delay_ms / 1e3


def model_min_rto_ms(fabric: Fabric) -> float:
    """The least (and first) RTO when the user left it to the fabric: a base round trip plus the full queues on
    the longest path, each drained at its rate. In an all-to-all every receiver's downlink queue fills at once, and
    a packet can wait behind one full switch queue and then part of another (measured: RTTs to 181 ms at 10
    Mbit/s and 128 KB queues, where one queue drains in 105 ms); across planes (PXN) it first crosses the NVLink
    port into a node-mate and waits in that node-mate's NIC queue with its node-mates' packets (measured on the
    64-GPU 8-plane all-to-all at 10 Mbit/s: round trips p50 270 ms, p99 881 ms, against a 212 ms floor computed as
    if every path were one plane's). A floor under that fires for packets that are only queued; the measured
    round trip (RFC 6298) takes the RTO higher."""
    nic_queue_s = fabric.queue_bytes * 8 / slowest_nic_bps(fabric)
    queues_s = 2 * nic_queue_s
    if fabric.nvlink_domains() and len(fabric.planes) > 1:
        gpu = fabric.gpu_hosts()[0]
        queues_s += nic_queue_s + fabric.queue_bytes * 8 / fabric.link(gpu, fabric.nvlink_peer(gpu))["bps"]
    return 1e3 * (base_rtt_s(fabric) + queues_s)


def model_window(fabric: Fabric, cc: str) -> int:
    """The window (packets in flight per queue pair) when the user left it to the fabric. With cc none: the
    bandwidth-delay product of the slowest NIC (a round trip of BASE_RTT_S plus each link's delay both ways on the
    longest path), at least one packet: what keeps a lone queue pair at line rate without filling queues for
    nothing (at 10 Mbit/s a round trip here is shorter than one 9000-byte packet). With a window-based control
    (rtt, pull) the window is only its ceiling: what one switch queue holds. DCQCN (ecn) sets a rate, as RoCE NICs
    have no window, and takes the bandwidth-delay product as none does: with a switch queue per queue pair, a
    15 -> 1 incast sends 15 queues' worth before the first CNP is back."""
    packet_bytes = fabric.mtu + wire.ETH
    queue_packets = max(1, min(63, fabric.queue_bytes // packet_bytes))
    if cc in ("rtt", "pull"):
        return queue_packets
    bdp_bits = slowest_nic_bps(fabric) * base_rtt_s(fabric)
    return max(1, min(queue_packets, math.ceil(bdp_bits / (packet_bytes * 8))))


def model_grant_limit(fabric: Fabric) -> int:
    """Pull's grant limit (packets a receiver has granted that have not arrived): one switch queue up to 2:1
    oversubscription, less beyond, as the square of 2 over it. In an all-to-all a leaf's uplinks carry what every
    receiver's grants ask of the leaf's hosts; measured on the paper's 8 planes with 2 leaves and 2 spines each
    (medians below at one seed): at 2:1 (8 nodes) a queue's worth each, 14, made 1.05x its bound and 7 made
    1.10x; at 4:1 (16 nodes) 14 overflowed the uplinks (148 k drops, 27 % resent), 7 still dropped 16 k and was
    CPU-bound, 3 made 1.07x with 0.2 % resent. A fit to those, not a law: other shapes may want their own."""
    queue = model_window(fabric, "pull")
    return max(1, min(queue, int(queue * (2 / fabric.oversubscription()) ** 2)))


def dcqcn_period_s(fabric: Fabric) -> float:
    """DCQCN's timer and CNP interval: its feedback delay, a queue at Kmax drained at the slowest NIC plus a base
    round trip, as hardware's 55 us are at 40 Gbit/s. With timers of 10 packet times, an incast 15 -> 1 swung its
    queue between empty and full all the run long."""
    return fabric.ecn_thresholds[1] * 8 / slowest_nic_bps(fabric) + base_rtt_s(fabric)

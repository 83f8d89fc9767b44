"""Every packet accounted for: what the agents sent and received beside what the kernel and the switch daemons
dropped, place by place, from counters read before and after a run. What no counter explains is `unattributed`
(sent - delivered - every counted drop), reported beside them and never folded into a place.

Places and the counters behind them (each a count of packets; none counts a packet another one counts):
- host NIC and NVLink queues: drops of the qdiscs right under our HTB (tc), by interface;
- switch egress: per switch, what its ports received less what they sent, less its input's drops below. Not
  its qdiscs' drop counts: ovs-vswitchd sends a batch with sendmmsg and, after a partial send, sends again from
  the packet the full queue dropped (counted twice, or dropped and then sent), and a batch's packets after a
  final drop are never offered (counted nowhere);
- switch daemon input: a userspace switch reads each port through an AF_PACKET socket, and a daemon that does
  not read in time loses what overflows that socket's buffer (sk_drops, read with sock_diag, only for the
  daemons' own sockets: a capture's are not the fabric's);
- host IP layer: per host, IP packets received that were neither delivered nor forwarded (InReceives -
  InDelivers - ForwDatagrams): a PXN forwarder's routes, a firewall rule, a martian;
- receive socket buffer: UDP InErrors (a full SO_RCVBUF, a bad checksum);
- interfaces: rx_dropped + tx_dropped of every interface of the run (emulator.net.monitor.netdev_counters);
- kernel backlog: the per-CPU receive backlog's drops (/proc/net/softnet_stat; the machine's, not per run);
- refused at send: what a host's kernel refused before any queue (a route, a firewall rule; the agents count);
- after the agents stopped: UDP NoPorts, packets that reached a host whose agent had ended (not a loss).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from emulator.model.fabric import Fabric
from emulator.net.qdiscs import HEADER, NLM_F_DUMP, NLM_F_REQUEST, attributes, messages
from traffic.netns import entered

PLACES = {
    "switch_queue": "switches' egress (queues and the daemons' sends)",
    "nic_queue": "host NIC queues",
    "nvlink_queue": "NVLink queues",
    "switch_input": "switch daemons' port input",
    "host_ip": "hosts' IP layer (PXN forwarding, routes, firewall)",
    "socket_buffer": "agents' receive socket buffers",
    "interface": "interfaces",
    "kernel_backlog": "the kernel's receive backlog",
    "refused": "refused at send by a host's kernel",
    "after_stop": "arrived after their agent stopped",
}
NOT_LOST = ("after_stop",)  # places that are sinks, not losses
# places the model has no queue for: a loss there is the emulator's, not the fabric's (emulator.net.monitor)
UNMODELLED = ("switch_input", "socket_buffer", "interface", "kernel_backlog")

Counters = dict[str, dict[str, int]]  # place -> name (interface, host, daemon) -> count


def place_of_interface(fabric: Fabric, intf: str) -> str:
    """Which queue place an interface's qdisc is: a switch's egress, a host's NIC, or NVLink (either side)."""
    node, _, port = intf.partition("-eth")
    if node not in fabric.graph or not port.isdigit():
        return "nic_queue"
    kind = next((d["kind"] for d in fabric.graph[node].values() if d["ports"][node] == int(port)), "host")
    if kind == "nvlink":
        return "nvlink_queue"
    return "switch_queue" if fabric.node(node)["kind"] == "switch" else "nic_queue"


def switch_losses(switches: Iterable[str], rx: dict[str, int], tx: dict[str, int],
                  input_drops: dict[str, int]) -> dict[str, int]:
    """Per switch: packets its ports took in and did not send out, less those its daemon never read (by interface
    counters, exact once nothing is in flight: emulator.net.emulation.Emulation.wait_drained)."""
    out = {s: 0 for s in switches}
    for counts, sign in ((rx, 1), (tx, -1), (input_drops, -1)):
        for intf, n in counts.items():
            node = intf.partition("-eth")[0]
            if node in out:
                out[node] += sign * n
    return out


def _snmp(text: str) -> dict[str, int]:
    """/proc/net/snmp (or netstat) as 'Ip.InReceives' -> value."""
    out: dict[str, int] = {}
    lines = text.splitlines()
    for head, values in zip(lines[::2], lines[1::2], strict=False):
        table = head.split(":")[0]
        for key, value in zip(head.split()[1:], values.split()[1:], strict=False):
            if value.lstrip("-").isdigit():
                out[f"{table}.{key}"] = int(value)
    return out


def host_counters(namespaces: dict[str, str | None]) -> Counters:
    """Per host (its namespace): the IP layer's unexplained input, UDP's receive errors and NoPorts."""
    out: Counters = {"host_ip": {}, "socket_buffer": {}, "after_stop": {}}
    for host, ns in namespaces.items():
        with entered(ns):
            snmp = _snmp(Path("/proc/thread-self/net/snmp").read_text())
        out["host_ip"][host] = snmp["Ip.InReceives"] - snmp["Ip.InDelivers"] - snmp["Ip.ForwDatagrams"]
        out["socket_buffer"][host] = snmp["Udp.InErrors"]
        out["after_stop"][host] = snmp["Udp.NoPorts"]
    return out


# sock_diag for AF_PACKET (linux/packet_diag.h, linux/sock_diag.h)
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY = 4, 20
PACKET_SHOW_INFO, PACKET_SHOW_MEMINFO = 0x1, 0x10
PACKET_DIAG_INFO, PACKET_DIAG_MEMINFO = 0, 6
SK_MEMINFO_RMEM_ALLOC, SK_MEMINFO_DROPS = 0, 8
PACKET_DIAG_REQ = struct.Struct("=BBHII8x")  # family, protocol, pad, inode, show, cookie
PACKET_DIAG_MSG = struct.Struct("=BBHI8x")   # family, type, num, inode, cookie


def parse_packet_diag(data: bytes) -> tuple[list[tuple[int, int, int, int]], bool]:
    """(inode, ifindex, bytes queued, drops) of every packet socket in a sock_diag dump, and whether it ended."""
    found, done = messages(data, SOCK_DIAG_BY_FAMILY, "packet socket dump")
    out = []
    for start, end in found:
        _family, _type, _num, inode = PACKET_DIAG_MSG.unpack_from(data, start)
        ifindex = queued = drops = 0
        for attr, value in attributes(data, start + PACKET_DIAG_MSG.size, end):
            if attr == PACKET_DIAG_INFO:
                (ifindex,) = struct.unpack_from("=I", value)
            elif attr == PACKET_DIAG_MEMINFO:
                queued = struct.unpack_from("=I", value, 4 * SK_MEMINFO_RMEM_ALLOC)[0]
                drops = struct.unpack_from("=I", value, 4 * SK_MEMINFO_DROPS)[0]
        out.append((inode, ifindex, queued, drops))
    return out, done


def packet_sockets(ns: str | None) -> list[tuple[int, str, int, int]]:
    """(inode, interface, bytes queued, drops) of every packet socket bound to an interface in a namespace."""
    with entered(ns):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
        names = dict(socket.if_nameindex())
    try:
        request = PACKET_DIAG_REQ.pack(socket.AF_PACKET, 0, 0, 0, PACKET_SHOW_INFO | PACKET_SHOW_MEMINFO)
        sock.send(HEADER.pack(HEADER.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
                  + request)
        found, done = [], False
        while not done:
            part, done = parse_packet_diag(sock.recv(1 << 17))
            found += part
    finally:
        sock.close()
    return [(inode, names[ifindex], queued, drops) for inode, ifindex, queued, drops in found if ifindex in names]


def socket_inodes(pids: Iterable[int]) -> set[int]:
    """The inodes of every socket the processes hold."""
    out = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = fd.readlink().name
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(int(target[8:-1]))
    return out


def switch_input_counters(namespaces: Sequence[str | None], own: set[int]) -> tuple[dict[str, int], dict[str, int]]:
    """Per switch port: packets its daemon's socket (one of `own`, socket_inodes of the daemons) dropped so far,
    and bytes waiting in it now."""
    drops, queued = {}, {}
    for ns in namespaces:
        for inode, intf, waiting, dropped in packet_sockets(ns):
            if inode in own:
                drops[intf] = drops.get(intf, 0) + dropped
                queued[intf] = queued.get(intf, 0) + waiting
    return drops, queued


def softnet_drops() -> int:
    """Packets the per-CPU receive backlogs dropped (netdev_max_backlog), over the machine's CPUs."""
    return sum(int(line.split()[1], 16) for line in Path("/proc/net/softnet_stat").read_text().splitlines())


@dataclass
class Accounting:
    """One run's packets: `sent` (every datagram the agents handed to the kernel), `delivered` (every one they
    read), `drops` per place, `where` the largest names per place, and what no counter explains."""

    sent: int = 0
    delivered: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    where: dict[str, dict[str, int]] = field(default_factory=dict)
    unattributed: int = 0

    @property
    def lost(self) -> int:
        return sum(n for place, n in self.drops.items() if place not in NOT_LOST)

    @property
    def unmodelled(self) -> int:
        """Packets lost where the model has no queue (the emulator's losses, not the fabric's)."""
        return sum(self.drops.get(place, 0) for place in UNMODELLED)

    def unattributed_share(self) -> float:
        return self.unattributed / self.sent if self.sent else 0.0

    def largest(self) -> str | None:
        """The place that lost most (None: nothing lost anywhere counted)."""
        lost = {p: n for p, n in self.drops.items() if p not in NOT_LOST and n > 0}
        return max(lost, key=lost.__getitem__) if lost else None

    def summary(self) -> str:
        """One clause for the verdict: what was lost, where most, and what no counter explains."""
        if not self.sent:
            return "no packets counted"
        text = f"{self.sent} packets sent, {self.delivered} delivered"
        largest = self.largest()
        if largest:
            worst = max(self.where.get(largest, {}).items(), key=lambda kv: kv[1], default=None)
            text += (f", {self.lost} dropped, most in {PLACES[largest]} ({self.drops[largest]}"
                     + (f"; {worst[1]} at {worst[0]}" if worst else "") + ")")
        return text + f", {self.unattributed} unattributed"


def account(before: Counters, after: Counters, sent: int, delivered: int, top: int = 5) -> Accounting:
    """The ledger of a run from two readings of the same counters (place -> name -> count) and the agents'
    totals; a counter that went down (an interface removed and made again) counts from zero."""
    drops, where = {}, {}
    for place in PLACES:
        grew = {name: n - before.get(place, {}).get(name, 0) if n >= before.get(place, {}).get(name, 0) else n
                for name, n in after.get(place, {}).items()}
        grew = {name: n for name, n in grew.items() if n > 0}
        drops[place] = sum(grew.values())
        if grew:
            where[place] = dict(sorted(grew.items(), key=lambda kv: -kv[1])[:top])
    result = Accounting(sent=sent, delivered=delivered, drops=drops, where=where)
    result.unattributed = sent - delivered - sum(drops.values())
    return result

"""Link shaping with HTB and byte-limited FIFOs, written as `tc -batch` lines and verified from `tc -j`.

Only HTB, TBF and pfifo/bfifo exist on module-less kernels, so every egress port gets
`htb (root 1:) -> class 1:1 at the link rate -> bfifo (10:) with the queue limit`. Where the kernel has them
and the model asks, the leaf is netem (delay, loss) and/or RED (ECN marking; under netem when both).

A port can also queue per traffic class or per queue pair (`queueing`): then class 1:1 holds one HTB class per
queue, each guaranteeing an equal share of the link and borrowing up to all of it, all at one priority and
quantum, so HTB serves the backlogged queues round-robin; u32 filters on the root pick the queue. Every queue
gets its own leaf of the kind above, each as deep as the one FIFO would be, so no queue is worse off than
the shared FIFO (but a port can then hold up to that many times the queue limit).

On a lossless fabric the leaf is a TBF gate (emulator.net.pause): open, at RESUME_RATE x the link rate with a
bucket of one frame, so HTB shapes and the gate only spreads out HTB's bursts (on resume a port sends at line
rate, not a burst of frames at once); paused, at a trickle. Per class, each class has its gate (and a lossless
host NIC then queues per class as well: emulator.net.network). Changing a TBF refills its tokens, so a pause
leaves no debt behind (HTB keeps a class's debt across a change). A paused TBF leaves its qdisc waiting on a
far timer, so a resumed one is woken by a frame sent into class 1:2, whose empty FIFO drops it: the dequeue that
follows serves the gate.

ovs-vswitchd resets the root qdisc of a port it adds, so shaping is applied after the ports exist and checked
afterwards. `replace` does not make a second run idempotent (this kernel's HTB refuses `replace` on an existing
HTB root): a repaired port found wrong is cleared and shaped afresh.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass

from emulator.model import wire
from emulator.model.fabric import RESUME_RATE, default_ecn_thresholds

ROOT = "1:"
CLASS = "1:1"
LEAF = "10:"

# class: traffic class c (the agents send it as TOS c << 5, DSCP 8c) queues in HTB class 1:(0x10 + c)
TCLASSES = 8
TOS_SHIFT = 5
TOS_MASK = (TCLASSES - 1) << TOS_SHIFT
CLASS_BASE = 0x10
# voq: RoCEv2 packets queue by the low bits of the BTH destination QP in 1:(0x20 + bucket); other traffic
# (TCP, pings, ARP) in 1:(0x20 + VOQ_BUCKETS). QP numbers come from the schedule and are unique only per host
# pair, so flows with equal QP numbers modulo VOQ_BUCKETS share a bucket, whichever hosts send them.
VOQ_BUCKETS = 16
VOQ_BASE = 0x20
VOQ_OTHER = VOQ_BASE + VOQ_BUCKETS
# Offset of the DestQP's low byte from the start of the IP header: IP (20 bytes: the agents send no options)
# and UDP, then the BTH up to the end of its FECN/BECN/reserved + 24-bit DestQP word (the PSN word follows).
QP_OFFSET = wire.IP_UDP + wire.BTH_HDR.size - 4 - 1
FILTER_TABLE = "800:"  # the u32 root hash table of the first u32 filter on a qdisc
CHILD_RED = 0x100  # RED under a child's netem leaf: handle of the leaf + this
KICK_CLASS, KICK_LEAF = "1:2", "2:"  # lossless: drops the frames that wake a resumed gate (marking.KICK_PRIORITY)


@dataclass(frozen=True)
class Shape:
    rate_bps: float
    mtu: int
    queue_bytes: int
    delay_ms: float = 0.0
    loss_pct: float = 0.0
    ecn: bool = False
    queueing: str = "fifo"
    ecn_thresholds: tuple[int, int, float] | None = None  # RED's min, max (bytes), probability; None: the defaults
    lossless: bool = False

    @property
    def leaf_kind(self) -> str:
        """The qdisc holding each queue, directly under its HTB class."""
        if self.lossless:
            return "tbf"
        if self.delay_ms or self.loss_pct:
            return "netem"
        return "red" if self.ecn else "bfifo"


def burst_bytes(mtu: int) -> int:
    """HTB's burst, cburst and quantum: at least two MTUs, as smaller ones make HTB stall on large frames."""
    return 2 * (mtu + 14)


def gate_burst(mtu: int) -> int:
    """A lossless gate's bucket: one frame, and a little more so rounding in the kernel never makes it less."""
    return mtu + wire.ETH + 64


def leaf_classes(queueing: str) -> list[str]:
    """The HTB classes holding the queues of a port: 1:1 itself for fifo, else its children."""
    if queueing == "class":
        return [_classid(CLASS_BASE + c) for c in range(TCLASSES)]
    if queueing == "voq":
        return [_classid(VOQ_BASE + b) for b in range(VOQ_BUCKETS)] + [_classid(VOQ_OTHER)]
    return [CLASS]


def default_class(queueing: str) -> str:
    """Where traffic no filter matches queues. It must be a leaf class: HTB sends packets whose default class is
    missing or inner through its direct queue, unshaped."""
    return {"class": _classid(CLASS_BASE), "voq": _classid(VOQ_OTHER)}.get(queueing, CLASS)


def filter_matches(queueing: str) -> list[tuple[str, str]]:
    """(class, u32 match) of every filter on the root, in the order they are tried."""
    if queueing == "class":  # the precedence bits only: ECN and the low DSCP bits do not move a packet
        return [(_classid(CLASS_BASE + c), f"match ip tos {c << TOS_SHIFT:#x} {TOS_MASK:#x}")
                for c in range(TCLASSES)]
    if queueing == "voq":
        roce = f"match ip protocol {socket.IPPROTO_UDP} 0xff match ip dport {wire.ROCE_PORT} 0xffff"
        return [(_classid(VOQ_BASE + b), f"{roce} match u8 {b:#x} {VOQ_BUCKETS - 1:#x} at {QP_OFFSET}")
                for b in range(VOQ_BUCKETS)]
    return []


def _classid(minor: int) -> str:
    return f"{ROOT}{minor:x}"  # tc reads class minors (and the htb default) as hex


def _minor(classid: str) -> str:
    return classid[len(ROOT):]


def tc_lines(intf: str, shape: Shape) -> list[str]:
    """`tc -batch` lines shaping one interface's egress."""
    rate = int(shape.rate_bps)
    burst = burst_bytes(shape.mtu)
    sizes = f"burst {burst} cburst {burst} quantum {burst}"
    lines = [
        f"qdisc replace dev {intf} root handle {ROOT} htb default {_minor(default_class(shape.queueing))}",
        f"class replace dev {intf} parent {ROOT} classid {CLASS} htb rate {rate}bit ceil {rate}bit {sizes}",
    ]
    if shape.lossless:
        lines += [f"class replace dev {intf} parent {ROOT} classid {KICK_CLASS} htb rate 8bit ceil 8bit {sizes}",
                  f"qdisc replace dev {intf} parent {KICK_CLASS} handle {KICK_LEAF} bfifo limit 0"]
    if shape.queueing == "fifo":
        return lines + _leaf_lines(intf, CLASS, LEAF, "20:", shape)
    queues = leaf_classes(shape.queueing)
    # The guaranteed rates add up to no more than the link: HTB lets a class under its own rate send without
    # asking its parent, so larger guarantees would let the port exceed the link rate.
    share = rate // len(queues)
    for classid in queues:
        minor = int(_minor(classid), 16)
        lines.append(f"class replace dev {intf} parent {CLASS} classid {classid} htb rate {share}bit "
                     f"ceil {rate}bit {sizes} prio 0")
        lines += _leaf_lines(intf, classid, f"{minor:x}:", f"{minor + CHILD_RED:x}:", shape)
    # Explicit filter handles (node id = the class minor), so `tc filter show` names each filter predictably.
    for classid, match in filter_matches(shape.queueing):
        lines.append(f"filter replace dev {intf} parent {ROOT} protocol ip prio 1 "
                     f"handle {FILTER_TABLE}:{_minor(classid)} u32 {match} flowid {classid}")
    return lines


def _leaf_lines(intf: str, parent: str, handle: str, red_handle: str, shape: Shape) -> list[str]:
    """The queue under one HTB class: bfifo, RED, netem, or RED under netem (then with `red_handle`)."""
    rate = int(shape.rate_bps)
    packets = max(2, shape.queue_bytes // shape.mtu)
    kmin, kmax, pmax = shape.ecn_thresholds or default_ecn_thresholds(shape.queue_bytes)
    kmin = max(kmin, shape.mtu)  # RED needs min < max, and a burst of packets at min
    # tc refuses a burst below min / avpkt (tc_red_eval_ewma: "burst 3 is too small ? Try burst 4"): at least that
    burst = max(2, -(-kmin // shape.mtu))
    red = (f"red limit {shape.queue_bytes * 4} min {kmin} max {max(kmax, kmin + shape.mtu)} avpkt {shape.mtu} "
           f"burst {burst} probability {pmax} bandwidth {rate}bit ecn")
    if shape.leaf_kind == "netem":
        netem = f"netem limit {packets} delay {shape.delay_ms}ms loss {shape.loss_pct}%"
        lines = [f"qdisc replace dev {intf} parent {parent} handle {handle} {netem}"]
        if shape.ecn:
            lines.append(f"qdisc replace dev {intf} parent {handle[:-1]}:1 handle {red_handle} {red}")
        return lines
    if shape.leaf_kind == "tbf":
        return [f"qdisc replace dev {intf} parent {parent} handle {handle} tbf rate {int(rate * RESUME_RATE)}bit "
                f"burst {gate_burst(shape.mtu)} limit {shape.queue_bytes}"]
    if shape.leaf_kind == "red":
        return [f"qdisc replace dev {intf} parent {parent} handle {handle} {red}"]
    return [f"qdisc replace dev {intf} parent {parent} handle {handle} bfifo limit {shape.queue_bytes}"]


def _qdiscs(qdisc_json: str) -> list[dict]:
    return [q for q in json.loads(qdisc_json or "[]") if "dev" in q]


def shaped_interfaces(qdisc_json: str, leaf_kind: str = "bfifo", queueing: str = "fifo") -> set[str]:
    """Interfaces whose root is our HTB with our leaf under every queue class of `queueing`, from
    `tc -j qdisc show` (all devices)."""
    qdiscs = _qdiscs(qdisc_json)
    htb_root = {q["dev"] for q in qdiscs if q.get("kind") == "htb" and q.get("root")
                and q.get("handle") == ROOT}
    leaves: dict[str, set[str]] = {}
    for q in qdiscs:
        if q.get("kind") == leaf_kind:
            leaves.setdefault(q["dev"], set()).add(q.get("parent"))
    wanted = set(leaf_classes(queueing))
    return {dev for dev in htb_root if wanted <= leaves.get(dev, set())}


def leaf_backlogs(qdisc_json: str) -> dict[str, dict[str, int]]:
    """Bytes waiting in each queue (a qdisc right under one of our HTB classes) of every interface, by class,
    from `tc -s -j qdisc show`. RED under netem is not counted apart: netem's backlog is the queue's."""
    out: dict[str, dict[str, int]] = {}
    for q in _qdiscs(qdisc_json):
        if q.get("parent", "").startswith(ROOT):
            out.setdefault(q["dev"], {})[q["parent"]] = int(q.get("backlog", 0))
    return out


def class_show_lines(intfs: list[str]) -> list[str]:
    """`tc -batch` lines printing each interface's classes (HTB classes have no JSON output in iproute2 6.1)."""
    return [f"class show dev {intf}" for intf in intfs]


def class_rates(intfs: list[str], output: str) -> dict[str, int]:
    """Rates of class 1:1 from the output of class_show_lines, one line per shaped interface, in order (the
    queue classes under it, 1:10 and up, are other lines)."""
    lines = [line for line in output.splitlines() if line.startswith(f"class htb {CLASS} ")]
    if len(lines) != len(intfs):
        return {}
    rates = {}
    for intf, line in zip(intfs, lines, strict=True):
        words = line.split()
        rates[intf] = _parse_rate(words[words.index("rate") + 1])
    return rates


def _parse_rate(text: str) -> int:
    for unit, factor in (("Gbit", 1e9), ("Mbit", 1e6), ("Kbit", 1e3), ("bit", 1)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    raise ValueError(f"unknown rate {text!r}")


def mismatches(expected: dict[str, float], actual: dict[str, int], tolerance: float = 0.01) -> list[str]:
    """Human-readable list of interfaces not shaped as the model says."""
    problems = []
    for intf, rate in sorted(expected.items()):
        got = actual.get(intf)
        if got is None:
            problems.append(f"{intf}: class rate not found")
        elif abs(got - rate) > tolerance * rate:
            problems.append(f"{intf}: {got} bit/s instead of {int(rate)}")
    return problems

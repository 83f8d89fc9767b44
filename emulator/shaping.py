"""Link shaping with HTB and a byte-limited FIFO, written as `tc -batch` lines and verified from `tc -j`.

Only HTB, TBF and pfifo/bfifo exist on module-less kernels, so every egress port gets
`htb (root 1:) -> class 1:1 at the link rate -> bfifo (10:) with the queue limit`. Where the kernel has them
and the model asks, the leaf is netem (delay, loss) and/or RED (ECN marking; under netem when both).
`replace` keeps the commands idempotent, which matters because ovs-vswitchd resets the root qdisc of a port
it adds: shaping is (re)applied after the ports exist and checked afterwards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

ROOT = "1:"
CLASS = "1:1"
LEAF = "10:"


@dataclass(frozen=True)
class Shape:
    rate_bps: float
    mtu: int
    queue_bytes: int
    delay_ms: float = 0.0
    loss_pct: float = 0.0
    ecn: bool = False

    @property
    def leaf_kind(self) -> str:
        """The qdisc directly under the HTB class."""
        if self.delay_ms or self.loss_pct:
            return "netem"
        return "red" if self.ecn else "bfifo"


def tc_lines(intf: str, shape: Shape) -> list[str]:
    """`tc -batch` lines shaping one interface's egress."""
    rate = int(shape.rate_bps)
    # Bursts and quantum of at least two MTUs: smaller ones make HTB stall on large frames and warn.
    burst = 2 * (shape.mtu + 14)
    lines = [
        f"qdisc replace dev {intf} root handle {ROOT} htb default 1",
        f"class replace dev {intf} parent {ROOT} classid {CLASS} htb rate {rate}bit ceil {rate}bit "
        f"burst {burst} cburst {burst} quantum {burst}",
    ]
    packets = max(2, shape.queue_bytes // shape.mtu)
    red = (f"red limit {shape.queue_bytes * 4} min {shape.queue_bytes // 4} max {shape.queue_bytes // 2} "
           f"avpkt {shape.mtu} burst {max(2, packets // 4)} probability 0.1 bandwidth {rate}bit ecn")
    if shape.leaf_kind == "netem":
        netem = f"netem limit {packets} delay {shape.delay_ms}ms loss {shape.loss_pct}%"
        lines.append(f"qdisc replace dev {intf} parent {CLASS} handle {LEAF} {netem}")
        if shape.ecn:
            lines.append(f"qdisc replace dev {intf} parent {LEAF[:-1]}:1 handle 20: {red}")
    elif shape.leaf_kind == "red":
        lines.append(f"qdisc replace dev {intf} parent {CLASS} handle {LEAF} {red}")
    else:
        lines.append(f"qdisc replace dev {intf} parent {CLASS} handle {LEAF} bfifo limit {shape.queue_bytes}")
    return lines


def shaped_interfaces(qdisc_json: str, leaf_kind: str = "bfifo") -> set[str]:
    """Interfaces whose root is our HTB with our leaf under class 1:1, from `tc -j qdisc show` (all devices)."""
    qdiscs = [q for q in json.loads(qdisc_json or "[]") if "dev" in q]
    htb_root = {q["dev"] for q in qdiscs if q.get("kind") == "htb" and q.get("root")
                and q.get("handle") == ROOT}
    return htb_root & {q["dev"] for q in qdiscs if q.get("kind") == leaf_kind and q.get("parent") == CLASS}


def class_show_lines(intfs: list[str]) -> list[str]:
    """`tc -batch` lines printing each interface's classes (HTB classes have no JSON output in iproute2 6.1)."""
    return [f"class show dev {intf}" for intf in intfs]


def class_rates(intfs: list[str], output: str) -> dict[str, int]:
    """Rates of class 1:1 from the output of class_show_lines, one line per shaped interface, in order."""
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

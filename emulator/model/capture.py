"""What a run captures, as plain data: interfaces or nodes of the fabric and the bytes kept per frame
(emulator.net.capture runs the tcpdumps)."""

from __future__ import annotations

from dataclasses import dataclass

from emulator.model.errors import UserError
from emulator.model.fabric import Fabric

MIN_SNAPLEN = 106  # Ethernet, IPv4, UDP, BTH, RETH and more: every header our agents send, whole


@dataclass(frozen=True)
class CaptureOptions:
    """What to capture: interfaces or nodes (all of a node's ports), None for every host's NICs; bytes per frame."""

    ports: tuple[str, ...] | None = None
    snaplen: int = MIN_SNAPLEN

    def check(self) -> CaptureOptions:
        if not MIN_SNAPLEN <= self.snaplen <= 65535:
            raise UserError(f"must be from {MIN_SNAPLEN} (our headers, whole) to 65535 bytes, got {self.snaplen}",
                            field="capture_bytes")
        return self


def interfaces(fabric: Fabric, ports: tuple[str, ...] | None) -> dict[str, str]:
    """The interfaces `ports` names (an interface, or a node for all its ports; None: every host's NICs), each
    with its node."""
    known = {fabric.intf(n, peer): n for n in fabric.graph for peer in fabric.graph[n]}
    if ports is None:
        return {intf: node for intf, node in sorted(known.items()) if fabric.node(node)["kind"] == "host"
                and fabric.graph[node][peer(fabric, intf, node)]["kind"] == "host"}
    chosen: dict[str, str] = {}
    for name in ports:
        if name in known:
            chosen[name] = known[name]
        elif name in fabric.graph:
            chosen.update({intf: node for intf, node in known.items() if node == name})
        else:
            raise UserError(f"{name!r} is neither an interface nor a node of this fabric", field="capture")
    return dict(sorted(chosen.items()))


def peer(fabric: Fabric, intf: str, node: str) -> str:
    """The node at the other end of `node`'s interface `intf`."""
    return next(peer for peer in fabric.graph[node] if fabric.intf(node, peer) == intf)

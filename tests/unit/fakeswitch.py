"""Fake OpenFlow 1.5 switches that apply the controller's messages to real flow and group tables and resolve
next hops the way Open vSwitch does, wired together as a fabric model says, so packets can be walked from
host to host without root.

What a switch honours: flow priorities, exact and masked matches (`udp_src` ranges, address prefixes), goto
table, output and group actions, select groups (live buckets split by weight) and fast-failover groups (first
live bucket), with bucket liveness from watched ports. What Open vSwitch would refuse or leave undefined is
an error here: a flow naming a group that does not exist, two flows of one priority matching one packet.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from emulator.model.fabric import Fabric

OFPGC_ADD_OR_MOD = 0x8000  # Open vSwitch's add-or-modify group command
HOP_LIMIT = 16  # more switches than any path of a small fabric: a walk this long is a loop
CONTROLLER = "controller"


class SwitchError(AssertionError):
    """A message or a table state that Open vSwitch would refuse, or that leaves forwarding undefined."""


def _number(value) -> int:
    return int(ipaddress.ip_address(value)) if isinstance(value, str) else int(value)


def _matches(match, packet: dict) -> bool:
    """Whether every field of `match` (exact, or (value, mask)) holds for `packet`."""
    for field, want in match.items():
        if field not in packet:
            return False
        value, mask = want if isinstance(want, tuple) else (want, -1)  # -1: every bit counts
        if (_number(packet[field]) ^ _number(value)) & _number(mask):
            return False
    return True


def _wire(match) -> bytes:
    buf = bytearray()
    match.serialize(buf, 0)
    return bytes(buf)


def _actions(actions) -> tuple:
    """Actions as comparable data."""
    out = []
    for action in actions:
        if isinstance(action, parser.OFPActionOutput):
            out.append(("output", action.port))
        elif isinstance(action, parser.OFPActionGroup):
            out.append(("group", action.group_id))
        else:
            raise SwitchError(f"the fake switch does not model {action}")
    return tuple(out)


def _instructions(instructions) -> tuple:
    out = []
    for inst in instructions:
        if isinstance(inst, parser.OFPInstructionGotoTable):
            out.append(("goto", inst.table_id))
        elif isinstance(inst, parser.OFPInstructionActions) and inst.type == ofp.OFPIT_APPLY_ACTIONS:
            out.append(("apply", _actions(inst.actions)))
        else:
            raise SwitchError(f"the fake switch does not model {inst}")
    return tuple(out)


def _groups_used(instructions: tuple) -> set[int]:
    return {gid for kind, actions in instructions if kind == "apply" for what, gid in actions if what == "group"}


@dataclass(frozen=True)
class Bucket:
    watch: int | None
    weight: int
    actions: tuple


@dataclass(frozen=True)
class Group:
    type: int
    buckets: tuple[Bucket, ...]


def _group(msg) -> Group:
    buckets = []
    for bucket in msg.buckets:
        props = {p.type: p for p in bucket.properties}
        if ofp.OFPGBPT_WATCH_GROUP in props:
            raise SwitchError("the fake switch does not model watched groups")
        watch = props.get(ofp.OFPGBPT_WATCH_PORT)
        weight = props.get(ofp.OFPGBPT_WEIGHT)
        buckets.append(Bucket(watch.watch if watch else None, weight.weight if weight else 1,
                              _actions(bucket.actions)))
    return Group(msg.type, tuple(buckets))


class FakeSwitch:
    """One switch's tables, groups and port states."""

    def __init__(self, name: str) -> None:
        self.name = name
        # (table, priority, match bytes) -> (match, cookie, instructions)
        self.flows: dict[tuple[int, int, bytes], tuple[object, int, tuple]] = {}
        self.groups: dict[int, Group] = {}
        self.down: set[int] = set()

    # -- messages -------------------------------------------------------------------------------
    def apply(self, msg) -> None:
        if isinstance(msg, parser.OFPFlowMod):
            self._flow_mod(msg)
        elif isinstance(msg, parser.OFPGroupMod):
            self._group_mod(msg)
        else:
            raise SwitchError(f"{self.name}: the fake switch does not model {type(msg).__name__}")

    def _flow_mod(self, msg) -> None:
        key = (msg.table_id, msg.priority, _wire(msg.match))
        if msg.command == ofp.OFPFC_ADD:  # replaces a flow with the same table, priority and match
            instructions = _instructions(msg.instructions)
            missing = _groups_used(instructions) - set(self.groups)
            if missing:
                raise SwitchError(f"{self.name}: a flow uses groups {missing}, which do not exist")
            self.flows[key] = (msg.match, msg.cookie, instructions)
        elif msg.command == ofp.OFPFC_DELETE_STRICT:
            if (msg.out_port, msg.out_group) != (ofp.OFPP_ANY, ofp.OFPG_ANY):
                raise SwitchError("the fake switch only deletes flows whatever they output to")
            self.flows.pop(key, None)
        else:
            raise SwitchError(f"{self.name}: the fake switch does not model flow command {msg.command}")

    def _group_mod(self, msg) -> None:
        exists = msg.group_id in self.groups
        if msg.command == ofp.OFPGC_ADD and exists or msg.command == ofp.OFPGC_MODIFY and not exists:
            raise SwitchError(f"{self.name}: group {msg.group_id}: add of an existing or modify of a missing one")
        if msg.command in (OFPGC_ADD_OR_MOD, ofp.OFPGC_ADD, ofp.OFPGC_MODIFY):
            self.groups[msg.group_id] = _group(msg)
        elif msg.command == ofp.OFPGC_DELETE:  # a deleted group takes the flows that use it along
            self.groups.pop(msg.group_id, None)
            self.flows = {key: flow for key, flow in self.flows.items() if msg.group_id not in _groups_used(flow[2])}
        else:
            raise SwitchError(f"{self.name}: the fake switch does not model group command {msg.command}")

    # -- what the switch reports ----------------------------------------------------------------
    def flow_entries(self) -> list[tuple[int, int, object]]:
        """(table, priority, match) of every flow, the match parsed back from its bytes as a flow-stats reply's."""
        return [(table, priority, parser.OFPMatch.parser(wire, 0)) for table, priority, wire in self.flows]

    def group_ids(self) -> list[int]:
        """Group ids, as a group-stats reply lists them."""
        return list(self.groups)

    def state(self) -> tuple[dict, dict]:
        """Flows and groups as comparable data: equal states forward alike."""
        return {key: (cookie, inst) for key, (_, cookie, inst) in self.flows.items()}, dict(self.groups)

    # -- forwarding -----------------------------------------------------------------------------
    def forward(self, packet: dict) -> dict:
        """Where a packet goes: output port (or CONTROLLER) -> the share of such packets sent there; {} is a drop."""
        return self._table(0, packet)

    def _table(self, table: int, packet: dict) -> dict:
        hits = [(key[1], inst) for key, (match, _, inst) in self.flows.items()
                if key[0] == table and _matches(match, packet)]
        if not hits:
            return {}  # a table miss drops, in OpenFlow 1.3 and later
        top = max(priority for priority, _ in hits)
        best = [inst for priority, inst in hits if priority == top]
        if len(best) > 1:
            raise SwitchError(f"{self.name}: table {table}: {len(best)} flows of priority {top} match {packet}")
        out: dict = {}
        for kind, arg in best[0]:
            if kind == "goto":
                if arg <= table:
                    raise SwitchError(f"{self.name}: goto table {arg} from table {table}")
                _add(out, self._table(arg, packet), 1.0)
            else:
                _add(out, self._apply(arg), 1.0)
        return out

    def _apply(self, actions: tuple) -> dict:
        out: dict = {}
        for what, arg in actions:
            if what == "output":
                _add(out, {CONTROLLER if arg == ofp.OFPP_CONTROLLER else arg: 1.0}, 1.0)
            else:
                _add(out, self._group_out(arg), 1.0)
        return out

    def _group_out(self, group_id: int) -> dict:
        group = self.groups[group_id]
        live = [b for b in group.buckets if b.watch is None or b.watch not in self.down]
        if group.type == ofp.OFPGT_FF:
            return self._apply(live[0].actions) if live else {}
        if group.type != ofp.OFPGT_SELECT:
            raise SwitchError(f"the fake switch does not model group type {group.type}")
        total = sum(b.weight for b in live)
        out: dict = {}
        for bucket in live:
            if bucket.weight:
                _add(out, self._apply(bucket.actions), bucket.weight / total)
        return out


def _add(into: dict, shares: dict, scale: float) -> None:
    for port, share in shares.items():
        into[port] = into.get(port, 0.0) + share * scale


@dataclass(frozen=True)
class Path:
    """One way a packet can go, and how it ends: delivered, dropped, dead link, wrong host, loop or controller."""

    nodes: tuple[str, ...]
    end: str

    def links(self) -> set[frozenset[str]]:
        return {frozenset(pair) for pair in zip(self.nodes, self.nodes[1:], strict=False)}


class FakeFabric:
    """A fake switch for every switch of a model, wired as the model says."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.switches = {name: FakeSwitch(name) for name in fabric.switches()}
        self.failed: set[frozenset[str]] = set()

    def apply(self, messages: dict[str, list]) -> None:
        for switch, msgs in messages.items():
            for msg in msgs:
                self.switches[switch].apply(msg)

    def state(self) -> dict:
        return {name: switch.state() for name, switch in self.switches.items()}

    def set_link(self, a: str, b: str, down: bool) -> list[tuple[str, int]]:
        """Take a link down or up; the (switch, port) whose state changed, as port-status messages would say."""
        (self.failed.add if down else self.failed.discard)(frozenset((a, b)))
        events = []
        for end, peer in ((a, b), (b, a)):
            if end in self.switches:
                port = self.fabric.port(end, peer)
                (self.switches[end].down.add if down else self.switches[end].down.discard)(port)
                events.append((end, port))
        return events

    def walk(self, src: str, dst_ip: str, **fields) -> list[Path]:
        """Every path a UDP packet from host `src` to `dst_ip` can take (select groups branch), hop by hop."""
        dst = self.fabric.host_by_ip(dst_ip)
        plane = next(rec["plane"] for rec in self.fabric.node(dst)["ports"].values() if rec["ip"] == dst_ip)
        leaf = self.fabric.nic_on_plane(src, plane)
        if leaf is None:
            raise ValueError(f"{src} has no NIC on plane {plane}")
        packet = {"eth_type": 0x0800, "ip_proto": 17, "ipv4_src": self.fabric.nic_ip(src, plane),
                  "ipv4_dst": dst_ip, "udp_src": 49152, "udp_dst": 4791, **fields}
        if frozenset((src, leaf)) in self.failed:
            return [Path((src, leaf), "dead link")]
        return self._hop(packet, (src, leaf), dst)

    def _hop(self, packet: dict, nodes: tuple[str, ...], dst: str) -> list[Path]:
        switch, came_from = nodes[-1], nodes[-2]
        outs = self.switches[switch].forward({**packet, "in_port": self.fabric.port(switch, came_from)})
        if not outs:
            return [Path(nodes, "dropped")]
        paths = []
        for port in outs:
            if port == CONTROLLER:
                paths.append(Path(nodes, CONTROLLER))
                continue
            peer = self.fabric.peer(switch, port)
            path = nodes + (peer,)
            if frozenset((switch, peer)) in self.failed:
                paths.append(Path(path, "dead link"))
            elif peer not in self.switches:
                paths.append(Path(path, "delivered" if peer == dst else "wrong host"))
            elif len(path) > HOP_LIMIT:
                paths.append(Path(path, "loop"))
            else:
                paths += self._hop(packet, path, dst)
        return paths


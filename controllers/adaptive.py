"""Adaptive routing: equal-cost next hops weighted by what each path can carry end to end, and away from
congestion, re-weighted every 100 ms.

A switch's select groups are per next-hop set and destination leaf, because where traffic goes decides what its
paths can carry: each next hop's bucket weight is its share of the path's width, the least room from here to the
destination leaf along the routes. A hop's room is its rate (from the model: a slowed link counts at its lowered
rate) thinned by its load right now, which the controller sees for the whole fabric: transmit rate (OpenFlow
port statistics, polled every POLL_INTERVAL) and egress queue backlog (tc statistics, which OpenFlow cannot
see: the emulator writes them to a file named by MPFT_QUEUES every 100 ms). So a slowed or backed-up spine ->
leaf hop, which the leaf that chooses cannot see, thins every path through it. The model is re-read when the
emulator rewrites it (degrade_link, restore). A group is re-sent (add-or-modify, in place) only when its weights
change.

Packets with entropy (UDP) are spread as spray's tables spread them (controllers/openflow.py), in proportion to
the paths' widths on the model's rates: the low bits of the source port pick one of 2**SLOT_BITS values, dealt to
the next hops by smooth weighted round robin, so a sender stepping its entropy per packet is split exactly and on
a symmetric fabric this is spray; a flow with one source port stays on its value's next hop. The values are
re-dealt only when the model's rates change: re-dealing them on load made Open vSwitch revalidate every datapath
flow each poll (measured: CPU-bound runs, and slower all-to-alls). Reacting to load within a round trip is left
to the senders, whose entropy leaves slow paths (traffic.transport's "reps"). Traffic without entropy (TCP)
takes the select group, weighted by width and load as above.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from os_ken.lib import hub

from controllers import openflow
from controllers.base import FabricApp
from controllers.valve import Messages, Valve
from emulator.model.errors import UserError
from emulator.model.fabric import Fabric

WEIGHT_SCALE = 100  # weights are whole numbers; the widest idle next hop gets this much
MIN_WEIGHT = 5
REWEIGHT_STEP = 10  # a select group is re-sent only when a weight moved this much: every group change makes OVS
# revalidate every datapath flow, and jitter of a few points moves nothing that matters
SLOT_BITS = 4  # source-port values a group's table deals out: 16 (each value is a datapath flow per destination)
MAX_TABLE = 254  # OpenFlow's last table: a switch with more groups than this hashes the rest only

GroupKey = tuple[tuple[int, ...], str]  # (next-hop ports, destination leaf)
Load = dict[str, dict[int, float]]  # switch -> port -> transmit rate / link rate + backlog / queue limit


def next_hop_weights(widths: list[float]) -> list[int]:
    """Bucket weights in proportion to each next hop's path width, the widest WEIGHT_SCALE, none below
    MIN_WEIGHT (a thin path still carries a little, so its load stays measured)."""
    widest = max(widths)
    return [max(MIN_WEIGHT, round(WEIGHT_SCALE * w / widest)) for w in widths]


def room(bps: float, load: float) -> float:
    """What a hop of rate `bps` has left for more traffic at `load` (transmit rate / rate + backlog / queue
    limit): all of it idle, a fifth saturated, less with a queue."""
    return bps / (1.0 + 4.0 * load)


def moved(old: list[int] | None, new: list[int]) -> bool:
    """Whether weights changed enough to re-send a group (REWEIGHT_STEP)."""
    return old is None or any(abs(a - b) >= REWEIGHT_STEP for a, b in zip(old, new, strict=True))


def weighted_slots(ports: tuple[int, ...], weights: list[int], n: int = 1 << SLOT_BITS) -> list[int]:
    """The next hop of each of `n` consecutive entropy values by smooth weighted round robin (as nginx's): each
    value goes to the port furthest behind its share, so every port's turns are spread out, not bunched."""
    total, credit, out = sum(weights), [0] * len(ports), []
    for _ in range(n):
        for i, w in enumerate(weights):
            credit[i] += w
        best = max(range(len(ports)), key=credit.__getitem__)
        credit[best] -= total
        out.append(ports[best])
    return out


class AdaptiveValve(Valve):
    """ECMP's routes, with groups per destination leaf whose bucket weights follow path width and load."""

    def __init__(self, fabric: Fabric, seed: int = 0) -> None:
        super().__init__(fabric, seed)
        self.weights: dict[str, dict[GroupKey, list[int]]] = {}  # the select groups' (width and load)
        self.slots: dict[str, dict[GroupKey, list[int]]] = {}  # each entropy value's next hop (width only)
        self.leaf_of = {rec["ip"]: fabric.nic_on_plane(host, rec["plane"]) for host in fabric.hosts()
                        for rec in fabric.node(host)["ports"].values() if rec["plane"] is not None}
        self._derived: tuple[object, dict[tuple[str, str], tuple[int, ...]], dict[str, dict[GroupKey, int]]]
        self._derived = (None, {}, {})
        self._dealt_for = fabric  # the model the entropy values were last dealt by

    def set_rates(self, fabric: Fabric) -> None:
        """The model again with its current link rates (same topology, so the routes stand)."""
        self.fabric = fabric

    def _tables(self) -> tuple[dict[tuple[str, str], tuple[int, ...]], dict[str, dict[GroupKey, int]]]:
        """From the routes, once per change (they are replaced whole when links fail or come back): each switch's
        next hops towards each leaf, and its group ids, one per multi-port next-hop set and destination leaf,
        numbered from 1."""
        if self._derived[0] is not self.routes:
            towards = {(sw, self.leaf_of[ip]): ports for sw, table in self.routes.items()
                       for ip, ports in table.items()}
            keys: dict[str, set[GroupKey]] = {}
            for (sw, leaf), ports in towards.items():
                if len(ports) > 1:
                    keys.setdefault(sw, set()).add((ports, leaf))
            groups = {sw: {key: i + 1 for i, key in enumerate(sorted(k))} for sw, k in keys.items()}
            self._derived = (self.routes, towards, groups)
        return self._derived[1], self._derived[2]

    def groups(self, switch: str) -> dict[GroupKey, int]:
        return self._tables()[1].get(switch, {})

    def width(self, switch: str, leaf: str, use: Load, memo: dict[tuple[str, str], float]) -> float:
        """The rate traffic at `switch` can reach `leaf` with along the routes: each next hop adds the lesser of
        its link (thinned by its load, `use`) and its own width onwards."""
        if switch == leaf:
            return float("inf")
        if (switch, leaf) not in memo:
            memo[(switch, leaf)] = sum(self._hop_width(switch, port, leaf, use, memo)
                                       for port in self._tables()[0][(switch, leaf)])
        return memo[(switch, leaf)]

    def _hop_width(self, switch: str, port: int, leaf: str, use: Load, memo: dict[tuple[str, str], float]) -> float:
        peer = self.fabric.peer(switch, port)
        return min(room(self.fabric.rate(switch, peer), use.get(switch, {}).get(port, 0.0)),
                   self.width(peer, leaf, use, memo))

    def utilisation(self, switch: str, backlog: dict[str, int]) -> dict[int, float]:
        """Per port: transmit rate over its rate plus queue backlog (bytes by port number) over the queue limit."""
        out = {}
        for peer, data in self.fabric.graph[switch].items():
            port = data["ports"][switch]
            rate = self.tx_bps.get((switch, port), 0.0) / self.fabric.rate(switch, peer)
            out[port] = rate + backlog.get(str(port), 0) / self.fabric.queue_bytes
        return out

    def group_weights(self, switch: str, use: Load, memo: dict[tuple[str, str], float]) -> dict[GroupKey, list[int]]:
        return {(ports, leaf): next_hop_weights([self._hop_width(switch, p, leaf, use, memo) for p in ports])
                for ports, leaf in self.groups(switch)}

    def switch_messages(self, switch: str) -> list:
        groups = self.groups(switch)
        weights = self.weights.setdefault(switch, {})
        slots = self.slots.setdefault(switch, {})
        for key, widths in self.group_weights(switch, {}, {}).items():
            weights.setdefault(key, widths)
            slots[key] = weighted_slots(key[0], widths)
        parser = self.dp.ofproto_parser
        msgs = []
        for key, gid in groups.items():
            msgs.append(openflow.select_group(self.dp, gid, key[0], self.hash_basis(switch), weights=weights[key]))
            if gid <= MAX_TABLE:
                msgs += openflow.spray_table(self.dp, gid, key[0], slots[key])
        for ip, ports in sorted(self.routes.get(switch, {}).items()):
            if len(ports) == 1:
                msgs.append(openflow.ipv4_flow(self.dp, ip, [parser.OFPActionOutput(ports[0])]))
                continue
            gid = groups[(ports, self.leaf_of[ip])]
            msgs.append(openflow.goto_flow(self.dp, ip, gid) if gid <= MAX_TABLE
                        else openflow.ipv4_flow(self.dp, ip, [parser.OFPActionGroup(gid)]))
        return msgs + [openflow.drop_miss(self.dp)]

    def reweight(self, backlog: dict[str, dict[str, int]], connected: Iterable[str]) -> Messages:
        """What the current rates and load change, re-sent in place (add-or-modify): select groups whose weights
        moved, and entropy values the model's rates now deal to another next hop; the rest are left alone.
        `backlog` is every switch port's egress backlog, as the emulator writes it."""
        out = {}
        use = {sw: self.utilisation(sw, backlog.get(sw, {})) for sw in self.fabric.switches()}
        memo: dict[tuple[str, str], float] = {}
        redeal = self._dealt_for is not self.fabric  # set_rates gave a new model since the values were dealt
        self._dealt_for = self.fabric
        idle: dict[tuple[str, str], float] = {}
        for switch in connected:
            groups = self.groups(switch)
            msgs = []
            for key, new in self.group_weights(switch, use, memo).items():
                if moved(self.weights.setdefault(switch, {}).get(key), new):
                    self.weights[switch][key] = new
                    msgs.append(openflow.select_group(self.dp, groups[key], key[0], self.hash_basis(switch),
                                                      weights=new))
            if redeal:
                msgs += self._redealt(switch, idle)
            if msgs:
                out[switch] = msgs
        return out


    def _redealt(self, switch: str, memo: dict[tuple[str, str], float]) -> list:
        """The fast-failover groups of the entropy values that the model's current rates deal to another next
        hop."""
        groups, msgs = self.groups(switch), []
        for key, widths in self.group_weights(switch, {}, memo).items():
            if groups[key] > MAX_TABLE:
                continue
            slots, before = weighted_slots(key[0], widths), self.slots.setdefault(switch, {}).get(key)
            self.slots[switch][key] = slots
            msgs += [openflow.slot_failover(self.dp, groups[key], value, key[0], port)
                     for value, port in enumerate(slots) if before is None or before[value] != port]
        return msgs


class AdaptiveApp(FabricApp):
    VALVE = AdaptiveValve
    POLL_INTERVAL = 0.1

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        queues = os.environ.get("MPFT_QUEUES")
        self.queue_file = Path(queues) if queues else None
        self._model_mtime = self.settings.fabric_file.stat().st_mtime_ns
        hub.spawn(self._reweight_loop)

    def queue_backlog(self) -> dict[str, dict[str, int]]:
        """Every switch port's egress backlog in bytes, as the emulator last wrote it."""
        if self.queue_file is None:
            return {}
        try:
            return json.loads(self.queue_file.read_text())
        except (OSError, ValueError):
            return {}

    def reload_rates(self) -> None:
        """Re-read the model when the emulator has rewritten it (a degraded or restored link)."""
        try:
            mtime = self.settings.fabric_file.stat().st_mtime_ns
            if mtime != self._model_mtime:
                self.valve.set_rates(Fabric.load(self.settings.fabric_file))
                self._model_mtime = mtime
        except (OSError, ValueError, UserError):  # unreadable: next poll
            pass

    def _reweight_loop(self) -> None:
        while True:
            hub.sleep(self.POLL_INTERVAL)
            self.reload_rates()
            self.send(self.valve.reweight(self.queue_backlog(), self.datapaths))

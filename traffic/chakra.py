"""Chakra execution traces (ASTRA-sim's `.et` files, one per rank) turned into a message schedule.

An `.et` file is a stream of protobuf messages (traffic.chakra_wire decodes them): a `GlobalMetadata`, then
`Node`s.

Mapping (see `load`):
- rank r runs on `hosts[r]` (pass `fabric.hosts(role='gpu')`); more ranks than hosts is an error.
- COMM_SEND on rank a to b is matched with the COMM_RECV on b from a with the same `comm_tag` (in node order
  when several share a tag) and becomes one message a -> b of the send's `comm_size`, op "send". It waits only
  for the sender's dependencies (an eager send: a message cannot depend on what its receiver sees); unmatched
  sends and recvs are reported. Their `comm_type` holds the NodeType number (5, 6), so it is not read.
- COMM_COLL_NODE: a collective spans its process group, named by its `pg_name` attribute (as ASTRA-sim reads it):
  none, or an undefined "0", is every rank. Groups are defined by the trace's own `## process_group:init ##`
  metadata nodes (PyTorch's pg_config_info, JSON in the node's input values: `pg_name` and `ranks`, where no ranks
  means every rank) and by a communicator-group file (ASTRA-sim's `--comm-group-configuration`: JSON
  `{"<pg_name>": [rank, ...]}`); one group defined twice with other ranks is an error. The k-th collective (in file
  order) of a group on each of its ranks forms one collective; they must agree on comm_type and comm_size, a rank
  outside the group is an error, surplus collectives are reported. `involved_dim` is not read. With N ranks in
  the group, in the group's rank order: ring r -> r+1 in steps of ceil(comm_size / N) bytes (comm_size is the
  per-rank buffer): REDUCE_SCATTER and ALL_GATHER N-1 steps, ALL_REDUCE 2(N-1) (reduce-scatter then all-gather);
  step s on rank r depends on what r sent and received at step s-1, as in NCCL's ring. ALL_TO_ALL sends
  ceil(comm_size / N) to each other rank, r to r+1, r+2, ... Other collectives, and comm nodes with comm_size 0,
  are skipped and reported.
- Nodes that carry no traffic (COMP_NODE, skipped and unmatched ones, ...) pass dependencies through: a message
  depends on the last messages its rank sent or received on each dependency path (`deps` of schedule.check).
  duration_micros of non-communication nodes sets `start_s`, the sum on the longest dependency path; the
  schedule format has no delay after a dependency, so this is a lower bound: compute that follows communication
  overlaps the network time instead of adding to it.
- data_deps and ctrl_deps are treated alike; a dependency on a node not in the file, or a cycle, is an error.
"""

from __future__ import annotations

import heapq
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from emulator.model.errors import UserError, load_json
from emulator.model.schedule import Message, check
from traffic.chakra_wire import read_records

NODE_TYPES = ("INVALID_NODE", "METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "COMP_NODE", "COMM_SEND_NODE",
              "COMM_RECV_NODE", "COMM_COLL_NODE", "STORAGE_NODE", "BATCH_NODE", "CHECKPOINT_NODE")
SEND, RECV, COLL = 5, 6, 7
COLLECTIVES = ("ALL_REDUCE", "REDUCE", "ALL_GATHER", "GATHER", "SCATTER", "BROADCAST", "ALL_TO_ALL",
               "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "BARRIER")
RING_STEPS = {"ALL_REDUCE": 2, "REDUCE_SCATTER": 1, "ALL_GATHER": 1}  # times N-1
METADATA, PG_INIT = 1, "process_group:init"  # PyTorch's metadata node that lists the process groups

# -- from nodes to messages ------------------------------------------------------------------------------
@dataclass
class _Node:
    rank: int
    id: int
    record: int
    type: int
    name: str
    deps: list[int]
    duration_us: int
    attrs: dict
    inputs: str = ""  # the input values, read only on PyTorch's process-group metadata node


@dataclass
class ChakraImport:
    """The messages, and what was not turned into traffic (so a researcher can see what the run leaves out)."""

    messages: list[Message]
    ranks: int
    node_types: Counter = field(default_factory=Counter)  # type name -> nodes over all ranks
    collectives: Counter = field(default_factory=Counter)  # collective type -> expanded collectives
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)  # pg_name -> ranks, of the groups used
    matched_sends: int = 0
    unmatched: list[str] = field(default_factory=list)  # sends, recvs and collectives with no partner
    skipped: Counter = field(default_factory=Counter)  # reason -> nodes that carry no traffic here

    def summary(self) -> str:
        parts = [f"{self.ranks} ranks, {len(self.messages)} messages", f"{self.matched_sends} matched sends"]
        parts += [f"{n} {kind}" for kind, n in sorted(self.collectives.items())]
        if self.groups:
            parts.append("process groups " + ", ".join(f"{name} (ranks {_span(ranks)})"
                                                        for name, ranks in sorted(self.groups.items())))
        parts += [f"{n} skipped ({why})" for why, n in sorted(self.skipped.items())]
        if self.unmatched:
            parts.append(f"{len(self.unmatched)} unmatched: {'; '.join(self.unmatched[:5])}"
                         + (" ..." if len(self.unmatched) > 5 else ""))
        return ", ".join(parts)


def _span(ranks: Sequence[int]) -> str:
    """Ranks as `0-3` when consecutive, else listed."""
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def read_comm_groups(path: str | Path) -> dict[str, tuple[int, ...]]:
    """ASTRA-sim's communicator-group file: JSON `{"<pg_name>": [rank, ...], ...}`."""
    data = load_json(Path(path), "communicator-group file")
    if not isinstance(data, dict):
        raise UserError('must be a JSON object {"<pg_name>": [rank, ...], ...}', file=str(path))
    for name, ranks in data.items():
        if not _rank_list(ranks) or not ranks:
            raise UserError(f"must be a non-empty list of distinct ranks >= 0, got {json.dumps(ranks)[:40]}",
                            file=str(path), field=name)
    return {name: tuple(ranks) for name, ranks in data.items()}


def _rank_list(ranks: object) -> bool:
    return isinstance(ranks, list) and all(type(r) is int and r >= 0 for r in ranks) and len(set(ranks)) == len(ranks)


def _pg_init_groups(node: _Node, path: Path) -> dict[str, tuple[int, ...]]:
    """The groups a `## process_group:init ##` node lists: PyTorch's pg_config_info as JSON in its input values,
    inside the converter's list quoting (`['[{"pg_name": "0", "ranks": [], ...}]']`); no ranks means every rank."""
    start, end = node.inputs.find("[{"), node.inputs.rfind("}]")
    if start < 0 or end < start:
        return {}
    try:
        items = json.loads(node.inputs[start:end + 2])
        groups = {str(item["pg_name"]): item.get("ranks") or [] for item in items}
    except (json.JSONDecodeError, TypeError, KeyError) as exc:
        raise UserError(f"record {node.record} ({PG_INIT} node {node.id}): its process groups are not a JSON list of "
                        f"{{pg_name, ranks}}: {getattr(exc, 'msg', exc)}", file=str(path), field="inputs") from None
    for name, ranks in groups.items():
        if not _rank_list(ranks):
            raise UserError(f"record {node.record} ({PG_INIT} node {node.id}): process group {name!r} must list "
                            f"distinct ranks >= 0, got {json.dumps(ranks)[:40]}", file=str(path), field="inputs")
    return {name: tuple(ranks) for name, ranks in groups.items()}


def rank_paths(source: str | Path | Sequence[str | Path]) -> list[Path]:
    """The files of ranks 0..N-1: a prefix `p` (or any one rank's file `p.3.et`) names `p.0.et`, `p.1.et`, ...;
    a list is taken in rank order."""
    if not isinstance(source, (str, Path)):
        return [Path(p) for p in source]
    prefix = Path(source)
    prefix = prefix.with_name(re.sub(r"\.\d+\.et$", "", prefix.name))
    pattern = re.compile(re.escape(prefix.name) + r"\.(\d+)\.et")
    found = {int(m.group(1)): p for p in prefix.parent.glob("*.et") if (m := pattern.fullmatch(p.name))}
    if not found:
        raise UserError(f"no Chakra trace files {prefix.name}.<rank>.et", file=str(prefix.parent))
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        raise UserError(f"rank files are missing: {prefix.name}.{missing[0]}.et", file=str(prefix.parent))
    return [found[r] for r in range(len(found))]


def _read_rank(rank: int, path: Path) -> dict[int, _Node]:
    """The nodes of one rank by id, in file order; dependencies must name nodes of the same file."""
    _meta, records = read_records(path)
    nodes: dict[int, _Node] = {}
    for record, d in records:
        node = _Node(rank, d.get("id", 0), record, d.get("type", 0), d.get("name", ""),
                     d.get("data_deps", []) + d.get("ctrl_deps", []), d.get("duration_micros", 0),
                     {a.get("name", ""): a.get("value") for a in d.get("attr", [])},
                     d.get("inputs", {}).get("values", ""))
        if node.id in nodes:
            raise UserError(f"record {record}: node id {node.id} already used by record {nodes[node.id].record}",
                            file=str(path), field="id")
        nodes[node.id] = node
    for record, d in records:
        for name in ("data_deps", "ctrl_deps"):
            for dep in d.get(name, []):
                if dep not in nodes:
                    raise UserError(f"record {record}: node {d.get('id', 0)} depends on node {dep}, which is not in "
                                    "this file", file=str(path), field=name)
    return nodes


def _attr_int(node: _Node, name: str, paths: list[Path], lo: int = 0, hi: int | None = None) -> int:
    value = node.attrs.get(name)
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value < lo \
            or (hi is not None and value > hi):
        bound = f"an integer {lo}..{hi}" if hi is not None else f"an integer >= {lo}"
        got = "missing" if value is None else repr(value)[:40]
        raise UserError(f"record {node.record} (node {node.id}, {NODE_TYPES[node.type]}): must be {bound}, got {got}",
                        file=str(paths[node.rank]), field=name)
    return value


def load(source: str | Path | Sequence[str | Path], hosts: Sequence[str],
         comm_groups: str | Path | None = None) -> ChakraImport:
    """A Chakra trace (prefix or files, one per rank) as messages between `hosts[rank]`, with process groups from
    the trace and from `comm_groups`, a communicator-group file (see module docstring)."""
    paths = rank_paths(source)
    if not paths:
        raise UserError("no Chakra trace files given")
    if len(paths) > len(hosts):
        raise UserError(f"{len(paths)} ranks but only {len(hosts)} GPU hosts in the fabric", file=str(paths[-1]))
    ranks = [_read_rank(r, p) for r, p in enumerate(paths)]
    expansion = _Expansion(ranks, paths, list(hosts))
    for rank, nodes in enumerate(ranks):
        for node in nodes.values():
            if node.type == METADATA and PG_INIT in node.name:
                for name, members in _pg_init_groups(node, paths[rank]).items():
                    expansion.define_group(name, members, f"{paths[rank].name} record {node.record} ({PG_INIT})",
                                           paths[rank], "inputs")
    if comm_groups is not None:
        for name, members in read_comm_groups(comm_groups).items():
            expansion.define_group(name, members, "the communicator-group file", Path(comm_groups), name)
    return expansion.run()


class _Expansion:
    """Groups nodes into units (a node, or the k-th collective of every rank), then emits them in dependency order.

    `frontier[key]`: the messages whose completion, seen by the node's rank, means the node is done.
    """

    def __init__(self, ranks: list[dict[int, _Node]], paths: list[Path], hosts: list[str]) -> None:
        self.ranks, self.paths, self.hosts, self.n = ranks, paths, hosts, len(ranks)
        self.result = ChakraImport(messages=[], ranks=self.n)
        self.kind: dict[tuple[int, int], str] = {}  # node key -> "send", "recv", "coll" or "pass"
        self.partner: dict[tuple[int, int], tuple[int, int]] = {}  # matched recv -> its send
        self.units: list[list[tuple[int, int]]] = []
        self.frontier: dict[tuple[int, int], set[int]] = {}
        self.finish: dict[tuple[int, int], int] = {}  # microseconds
        self.sent: dict[tuple[int, int], int] = {}
        self.groups: dict[str, tuple[tuple[int, ...], str]] = {}  # pg_name -> its ranks, and where they were given

    def define_group(self, name: str, ranks: tuple[int, ...], where: str, path: Path, field: str) -> None:
        """A process group's ranks (none: every rank); the same name given twice must name the same ranks."""
        ranks = ranks or tuple(range(self.n))
        if max(ranks) >= self.n:
            raise UserError(f"{where}: process group {name!r} names rank {max(ranks)}, but the trace has {self.n} "
                            "ranks", file=str(path), field=field)
        if name in self.groups and self.groups[name][0] != ranks:
            raise UserError(f"{where}: process group {name!r} has ranks {_span(ranks)}, but {self.groups[name][1]} "
                            f"gave {_span(self.groups[name][0])}", file=str(path), field=field)
        self.groups.setdefault(name, (ranks, where))

    def _group_of(self, key: tuple[int, int]) -> str:
        node = self._node(key)
        name = node.attrs.get("pg_name", "")
        if isinstance(name, bool) or not isinstance(name, (str, int)):
            raise UserError(f"record {node.record} (node {node.id}, COMM_COLL_NODE): must be a string, got "
                            f"{repr(name)[:40]}", file=str(self.paths[node.rank]), field="pg_name")
        return str(name)

    def _members(self, name: str, first: dict[int, tuple[int, int]]) -> tuple[int, ...]:
        """The ranks of process group `name`; every rank that runs one of its collectives (`first`: rank -> its
        first one) must be one of them."""
        if name in self.groups:
            members = self.groups[name][0]
        elif name in ("", "0"):  # no group, or PyTorch's default group left undefined: the world
            members = tuple(range(self.n))
        else:
            node = self._node(first[min(first)])
            raise UserError(f"record {node.record} (node {node.id}, COMM_COLL_NODE): process group {name!r} is not "
                            f"defined: no {PG_INIT} node lists it; give a communicator-group file (--comm-groups, or "
                            "comm_groups in a scenario)",
                            file=str(self.paths[node.rank]), field="pg_name")
        for rank in first:
            if rank not in members:
                node = self._node(first[rank])
                raise UserError(f"record {node.record} (node {node.id}, COMM_COLL_NODE): rank {rank} is not in "
                                f"process group {name!r} (ranks {_span(members)})", file=str(self.paths[rank]),
                                field="pg_name")
        return members

    def _skip(self, key: tuple[int, int], why: str) -> None:
        self.kind[key] = "pass"
        self.result.skipped[why] += 1

    def _classify(self) -> None:
        sends, recvs, colls = defaultdict(list), defaultdict(list), defaultdict(list)
        for rank, nodes in enumerate(self.ranks):
            for node in nodes.values():
                key = (rank, node.id)
                self.result.node_types[NODE_TYPES[node.type] if node.type < len(NODE_TYPES) else str(node.type)] += 1
                self.kind[key] = "pass"
                if node.type not in (SEND, RECV, COLL):
                    continue
                # comm_type on send/recv nodes holds the NodeType number (5, 6), not a collective: not read.
                size = _attr_int(node, "comm_size", self.paths)
                if size == 0:
                    self._skip(key, "zero comm_size")
                elif node.type == SEND:
                    peer = _attr_int(node, "comm_dst", self.paths, 0, self.n - 1)
                    sends[rank, peer, _attr_int(node, "comm_tag", self.paths, -(1 << 63))].append(key)
                elif node.type == RECV:
                    peer = _attr_int(node, "comm_src", self.paths, 0, self.n - 1)
                    recvs[peer, rank, _attr_int(node, "comm_tag", self.paths, -(1 << 63))].append(key)
                else:
                    _attr_int(node, "comm_type", self.paths)
                    colls[rank].append(key)
        for a, b, tag in sorted(set(sends) | set(recvs)):
            s, r = sends[a, b, tag], recvs[a, b, tag]
            for send, recv in zip(s, r, strict=False):
                self.kind[send], self.kind[recv], self.partner[recv] = "send", "recv", send
                self.units += [[send], [recv]]
            left = [f"rank {a} node {k[1]}: send to rank {b} tag {tag}" for k in s[len(r):]]
            left += [f"rank {b} node {k[1]}: recv from rank {a} tag {tag}" for k in r[len(s):]]
            if left:
                self.result.unmatched += left
                self.result.skipped["unmatched send/recv"] += len(left)
        self._group_collectives(colls)
        self.units += [[key] for key, kind in self.kind.items() if kind == "pass"]

    def _group_collectives(self, colls: dict[int, list[tuple[int, int]]]) -> None:
        """The k-th collective (in file order) of a process group on each of its ranks is one collective; their
        types and sizes must agree."""
        by_group: dict[str, dict[int, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
        for rank in range(self.n):
            for key in colls[rank]:
                by_group[self._group_of(key)][rank].append(key)
        for name, of_rank in by_group.items():
            members = self._members(name, {rank: keys[0] for rank, keys in of_rank.items()})
            self._expand_group(name, members, [of_rank[r] for r in members])

    def _expand_group(self, name: str, members: tuple[int, ...], colls: list[list[tuple[int, int]]]) -> None:
        count = min(map(len, colls))
        label = f" of process group {name!r}" if name else ""
        for rank, keys in zip(members, colls, strict=True):
            for key in keys[count:]:
                self.result.unmatched.append(f"rank {rank} node {key[1]}: collective #{count + 1}{label} has no "
                                             "partner on every rank of its group")
                self.result.skipped["unmatched collective"] += 1
        for k in range(count):
            group = [keys[k] for keys in colls]
            first = self._node(group[0])
            for node in map(self._node, group):
                if (node.attrs["comm_type"], node.attrs["comm_size"]) != (first.attrs["comm_type"],
                                                                          first.attrs["comm_size"]):
                    raise UserError(f"record {node.record}: collective #{k + 1}{label} differs from rank "
                                    f"{first.rank}'s (comm_type, comm_size)", file=str(self.paths[node.rank]),
                                    field="comm_type")
            kind = first.attrs["comm_type"]
            coll = COLLECTIVES[kind] if kind < len(COLLECTIVES) else f"comm_type {kind}"
            if coll not in RING_STEPS and coll != "ALL_TO_ALL":
                why = f"{coll} not supported"
            elif len(group) == 1:
                why = "collective on one rank"
            else:
                for key in group:
                    self.kind[key] = "coll"
                self.units.append(group)
                self.result.collectives[coll] += 1
                if label:
                    self.result.groups[name] = members
                continue
            for key in group:
                self._skip(key, why)

    def _node(self, key: tuple[int, int]) -> _Node:
        return self.ranks[key[0]][key[1]]

    def _ready(self, key: tuple[int, int]) -> int:
        """When the last of a node's parents finished computing (microseconds)."""
        return max((self.finish[key[0], d] for d in self._node(key).deps), default=0)

    def _after(self, key: tuple[int, int]) -> tuple[set[int], int]:
        """What a node waits for: its parents' frontier, and _ready."""
        return set().union(*(self.frontier[key[0], d] for d in self._node(key).deps)), self._ready(key)

    def _emit(self, src: int, dst: int, size: int, deps: set[int], start_us: int, op: str, key) -> int:
        node = self._node(key)
        self.result.messages.append(Message(id=len(self.result.messages), start_s=start_us / 1e6, src=self.hosts[src],
                                            dst=self.hosts[dst], bytes=size, deps=tuple(sorted(deps)), op=op,
                                            tag=node.name or NODE_TYPES[node.type]))
        return len(self.result.messages) - 1

    def _run_unit(self, unit: list[tuple[int, int]]) -> None:
        key = unit[0]
        node, kind = self._node(key), self.kind[key]
        deps, ready = self._after(key)
        if kind == "send":
            peer = node.attrs["comm_dst"]
            self.sent[key] = self._emit(key[0], peer, node.attrs["comm_size"], deps, ready, "send", key)
            self.frontier[key], self.finish[key] = {self.sent[key]}, ready
            self.result.matched_sends += 1
        elif kind == "recv":
            send = self.partner[key]
            self.frontier[key] = deps | {self.sent[send]}
            self.finish[key] = max(ready, self.finish[send])
        elif kind == "coll":
            self._collective(unit)
        else:
            self.frontier[key] = deps
            self.finish[key] = ready + (node.duration_us if node.type not in (SEND, RECV, COLL) else 0)

    def _collective(self, group: list[tuple[int, int]]) -> None:
        """One collective over its group's ranks; r below is a rank's place in the group's order."""
        n = len(group)
        after = [self._after(key) for key in group]
        node = self._node(group[0])
        chunk = math.ceil(node.attrs["comm_size"] / n)
        name = COLLECTIVES[node.attrs["comm_type"]]
        sent: list[list[int]] = [[] for _ in range(n)]
        received: list[list[int]] = [[] for _ in range(n)]

        def emit(r: int, dst: int, deps: set[int]) -> None:
            m = self._emit(group[r][0], group[dst][0], chunk, deps, after[r][1], "write", group[r])
            sent[r].append(m)
            received[dst].append(m)

        if name == "ALL_TO_ALL":
            for offset in range(1, n):
                for r in range(n):
                    emit(r, (r + offset) % n, after[r][0])
            done = [set(sent[r] + received[r]) for r in range(n)]
        else:
            for step in range(RING_STEPS[name] * (n - 1)):
                for r in range(n):
                    emit(r, (r + 1) % n, {sent[r][-1], received[r][-1]} if step else after[r][0])
            done = [{sent[r][-1], received[r][-1]} for r in range(n)]
        for r, key in enumerate(group):
            self.frontier[key], self.finish[key] = done[r], after[r][1]

    def run(self) -> ChakraImport:
        self._classify()
        unit_of = {key: i for i, unit in enumerate(self.units) for key in unit}
        children: list[set[int]] = [set() for _ in self.units]
        waiting = [0] * len(self.units)
        for i, unit in enumerate(self.units):
            parents = {unit_of[(k[0], d)] for k in unit for d in self._node(k).deps}
            if unit[0] in self.partner:
                parents.add(unit_of[self.partner[unit[0]]])
            for p in parents:
                children[p].add(i)
            waiting[i] = len(parents)

        def entry(i: int) -> tuple:
            key = self.units[i][0]
            return max(map(self._ready, self.units[i])), key[0], self._node(key).record, i

        heap = [entry(i) for i, w in enumerate(waiting) if not w]
        heapq.heapify(heap)
        done = 0
        while heap:
            i = heapq.heappop(heap)[-1]
            self._run_unit(self.units[i])
            done += 1
            for c in children[i]:
                waiting[c] -= 1
                if not waiting[c]:
                    heapq.heappush(heap, entry(c))
        if done < len(self.units):
            stuck = min((self._node(u[0]).rank, self._node(u[0]).record, u[0]) for i, u in enumerate(self.units)
                        if waiting[i])
            raise UserError(f"record {stuck[1]}: node {stuck[2][1]} is in or after a dependency cycle (across "
                            "ranks through send/recv or collective order)", file=str(self.paths[stuck[0]]),
                            field="data_deps")
        if not self.result.messages:
            raise UserError(f"no communication to emulate ({self.result.summary()})", file=str(self.paths[0]))
        check(self.result.messages, self.hosts)
        return self.result

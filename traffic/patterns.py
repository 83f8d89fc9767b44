"""Traffic pattern generators: each returns a list of Messages (ids 0..n-1 in order) for a fabric.

Patterns: MoE expert-parallel dispatch/combine (the paper's DeepSeek-V3 exchange), incast, permutation (shift
and random derangement), ring all-reduce, all-gather and reduce-scatter, 3FS-style storage reads and writes,
write-then-flag pairs (ordering under spraying); `mix` merges schedules. Randomness comes only from
`random.Random(seed)`, so a seed fixes the schedule.
Every generator also takes `start_s`, `tclass` and `qp`, copied into each message, so mixed schedules can sit
in different traffic classes or queue pairs. Defaults suit the default fabric (2-plane, 16-node MPFT at
10 Mbit/s): each pattern keeps a NIC busy for a few seconds.
"""

from __future__ import annotations

import inspect
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from emulator.model import naming, schedule
from emulator.model.errors import UserError
from emulator.model.fabric import Fabric
from emulator.model.schedule import MAX_QP, Message

KiB, MiB = 1024, 1024 * 1024


class _Trace:
    """Appends messages with consecutive ids and the settings every message of a pattern shares."""

    def __init__(self, start_s: float, tclass: int, qp: int) -> None:
        self.messages: list[Message] = []
        self.common = {"start_s": float(start_s), "tclass": tclass, "qp": qp}

    def add(self, src: str, dst: str, size: int, tag: str, deps: Iterable[int] = (), op: str = "write") -> int:
        msg = Message(id=len(self.messages), src=src, dst=dst, bytes=int(size), deps=tuple(deps), op=op, tag=tag,
                      **self.common)
        self.messages.append(msg)
        return msg.id


# -- hosts -------------------------------------------------------------------------------------------------
def compute_hosts(fabric: Fabric, plane: int | None = None) -> list[str]:
    """GPU hosts (plain hosts on ft2/ft3), plane-major, so list neighbours share a plane (shift-1 stays in it)."""
    hosts = fabric.gpu_hosts()
    if plane is not None:
        hosts = [h for h in hosts if fabric.node(h)["plane"] == plane]
    return sorted(hosts, key=lambda h: (fabric.node(h)["plane"], fabric.node(h)["index"]))


def _pick_hosts(fabric: Fabric, hosts: Sequence[str] | None, plane: int | None) -> list[str]:
    """The user's host order (checked against the fabric) or compute_hosts, optionally one plane only."""
    if hosts is None:
        chosen = compute_hosts(fabric, plane)
    else:
        known = set(fabric.hosts())
        for h in hosts:
            if h not in known:
                raise UserError(f"unknown host {h!r} (not in this fabric)", field="hosts")
        if len(set(hosts)) != len(hosts):
            raise UserError("a host appears twice", field="hosts")
        chosen = [h for h in hosts if plane is None or fabric.node(h)["plane"] == plane]
    if len(chosen) < 2:
        where = f" on plane {plane}" if plane is not None else ""
        raise UserError(f"needs at least 2 hosts{where}, found {len(chosen)}",
                        field="plane" if plane is not None else "hosts")
    return chosen


def node_rows(fabric: Fabric) -> list[list[str]]:
    """Compute hosts grouped by node (ordered by GPU index); a host without a node is a node of its own."""
    rows: dict[Any, list[str]] = defaultdict(list)
    for h in fabric.gpu_hosts():
        d = fabric.node(h)
        rows[("node", d["node"]) if d.get("node") is not None else ("host", h)].append(h)
    return [sorted(row, key=lambda h: fabric.node(h).get("gpu") or 0) for row in rows.values()]


# -- MoE expert parallelism --------------------------------------------------------------------------------
def moe_routes(fabric: Fabric, tokens_per_gpu: int, top_k: int, experts_per_gpu: int, node_limit: int,
               seed: int) -> dict[str, list[tuple[str, ...]]]:
    """For every GPU, each token's top_k routed experts as the GPUs holding them (a GPU repeats if it holds
    several). Node-limited routing: pick `node_limit` nodes uniformly, then top_k experts among theirs."""
    rows = node_rows(fabric)
    limit = min(node_limit, len(rows))
    pool_size = sum(sorted(len(r) for r in rows)[:limit]) * experts_per_gpu
    if top_k > pool_size:
        raise UserError(f"{top_k} experts do not fit in {limit} nodes holding {pool_size} experts",
                        field="top_k")
    rng = random.Random(seed)
    routes = {}
    for row in rows:
        for src in row:
            tokens = []
            for _ in range(tokens_per_gpu):
                nodes = sorted(rng.sample(range(len(rows)), limit))
                pool = [(gpu, e) for n in nodes for gpu in rows[n] for e in range(experts_per_gpu)]
                tokens.append(tuple(gpu for gpu, _ in rng.sample(pool, top_k)))
            routes[src] = tokens
    return routes


def moe(fabric: Fabric, *, tokens_per_gpu: int = 32, hidden: int = 7168, top_k: int = 8, experts_per_gpu: int = 8,
        node_limit: int = 4, scale: float = 1.0, seed: int = 0, start_s: float = 0.0, tclass: int = 0,
        qp: int = 1) -> list[Message]:
    """DeepSeek-V3 expert-parallel all-to-all: dispatch, then combine (defaults: the paper's decode, 32 tokens
    per GPU, hidden 7168; 8 experts per GPU on 32 GPUs gives V3's 256 routed experts).

    Each GPU is one EP rank. A token crosses the scale-out network once per node holding one of its experts:
    to that node's relay, the GPU with the sender's GPU index (same plane), which forwards it over NVLink to
    the node's other GPUs holding its experts. Experts on the sender itself, and the shared expert every token
    also visits (on its own GPU), cost no traffic. One message per (src, dst) pair per phase, carrying
    count(tokens) x d bytes, with d = max(1, round(hidden x scale)) for FP8 dispatch (1 byte per element) and
    2d for BF16 combine (2 bytes per element). Phases, tagged moe/<phase>, in file order:
    dispatch (origin -> relay), dispatch-nvlink (relay -> expert GPU; after all dispatch the relay received),
    combine-nvlink (expert GPU -> relay) and combine (relay -> origin); a combine-phase message waits for
    everything its sender received before (the experts run on all their tokens, the relay reduces).
    """
    routes = moe_routes(fabric, tokens_per_gpu, top_k, experts_per_gpu, node_limit, seed)
    rows = node_rows(fabric)
    node_of = {h: n for n, row in enumerate(rows) for h in row}
    slot = {h: row.index(h) for row in rows for h in row}
    rank = {h: i for i, h in enumerate(routes)}
    scale_out: Counter[tuple[str, str]] = Counter()
    nvlink: Counter[tuple[str, str]] = Counter()
    for src, tokens in routes.items():
        for gpus in tokens:
            for n in {node_of[g] for g in gpus}:
                relay = rows[n][slot[src] % len(rows[n])]
                if relay != src:
                    scale_out[src, relay] += 1
                for gpu in {g for g in gpus if node_of[g] == n} - {relay}:
                    nvlink[relay, gpu] += 1
    d = max(1, round(hidden * scale))
    trace = _Trace(start_s, tclass, qp)
    received: dict[str, list[int]] = defaultdict(list)

    def phase(pairs: Counter[tuple[str, str]], reverse: bool, size: int, tag: str) -> None:
        before = {h: list(ids) for h, ids in received.items()}
        for a, b in sorted(pairs, key=lambda p: (rank[p[0]], rank[p[1]])):
            src, dst = (b, a) if reverse else (a, b)
            received[dst].append(trace.add(src, dst, pairs[a, b] * size, tag, before.get(src, ())))

    phase(scale_out, False, d, "moe/dispatch")
    phase(nvlink, False, d, "moe/dispatch-nvlink")
    phase(nvlink, True, 2 * d, "moe/combine-nvlink")
    phase(scale_out, True, 2 * d, "moe/combine")
    return trace.messages


# -- classic fabric benchmarks -----------------------------------------------------------------------------
def incast(fabric: Fabric, *, senders: int = 8, receiver: str | None = None, size: int = 512 * KiB,
           hosts: Sequence[str] | None = None, plane: int | None = None, seed: int = 0, start_s: float = 0.0,
           tclass: int = 0, qp: int = 1) -> list[Message]:
    """N -> 1: `senders` hosts chosen at random send `size` bytes each to `receiver` (default the first host).
    Hosts on the receiver's node are left out: they would reach it over NVLink, not through its NIC."""
    pool = _pick_hosts(fabric, hosts, plane)
    receiver = receiver if receiver is not None else pool[0]
    if receiver not in fabric.graph or fabric.node(receiver)["kind"] != "host":
        raise UserError(f"unknown host {receiver!r} (not in this fabric)", field="receiver")
    node = fabric.node(receiver).get("node")
    others = [h for h in pool if h != receiver and (node is None or fabric.node(h).get("node") != node)]
    if senders > len(others):
        raise UserError(f"only {len(others)} hosts can send to {receiver}, asked for {senders}", field="senders")
    chosen = set(random.Random(seed).sample(others, senders))
    trace = _Trace(start_s, tclass, qp)
    for h in others:
        if h in chosen:
            trace.add(h, receiver, size, "incast")
    return trace.messages


def flow(fabric: Fabric, *, src: str | None = None, dst: str | None = None, size: int = 2 * MiB,
         start_s: float = 0.0, tclass: int = 0, qp: int = 1) -> list[Message]:
    """One message from `src` to `dst` (default the first host to the last): a victim beside an incast, or any
    single transfer to follow."""
    pool = compute_hosts(fabric)
    src = pool[0] if src is None else src
    dst = pool[-1] if dst is None else dst
    for key, host in (("src", src), ("dst", dst)):
        if host not in fabric.graph or fabric.node(host)["kind"] != "host":
            raise UserError(f"unknown host {host!r} (not in this fabric)", field=key)
    if src == dst:
        raise UserError(f"a flow from {src} to itself sends nothing over the fabric", field="dst")
    trace = _Trace(start_s, tclass, qp)
    trace.add(src, dst, size, "flow")
    return trace.messages


def _derangement(n: int, rng: random.Random) -> list[int]:
    """A uniformly random permutation without fixed points (about e shuffles on average)."""
    order = list(range(n))
    while True:
        rng.shuffle(order)
        if all(i != j for i, j in enumerate(order)):
            return order


def permutation(fabric: Fabric, *, kind: str = "random", shift: int = 1, size: int = 2 * MiB,
                hosts: Sequence[str] | None = None, plane: int | None = None, seed: int = 0, start_s: float = 0.0,
                tclass: int = 0, qp: int = 1) -> list[Message]:
    """Every host sends `size` bytes to one other, each receiving once: shift-k (host i -> i+k mod n in the host
    order) or a seeded random derangement. `plane` keeps it inside one plane, as planes are isolated."""
    order = _pick_hosts(fabric, hosts, plane)
    n = len(order)
    if kind == "shift":
        if shift % n == 0:
            raise UserError(f"a shift of {shift} over {n} hosts sends every host to itself", field="shift")
        targets = [(i + shift) % n for i in range(n)]
    elif kind == "random":
        targets = _derangement(n, random.Random(seed))
    else:
        raise UserError(f"must be random or shift, got {kind!r}", field="kind")
    trace = _Trace(start_s, tclass, qp)
    for i, j in enumerate(targets):
        trace.add(order[i], order[j], size, f"permutation/{kind}")
    return trace.messages


def all_to_all(fabric: Fabric, *, size: int = 256 * KiB, hosts: Sequence[str] | None = None,
               plane: int | None = None, start_s: float = 0.0, tclass: int = 0, qp: int = 1) -> list[Message]:
    """Every host sends `size` bytes to every other at once: the uniform all-to-all of expert-parallel dispatch
    without MoE's skew (the `moe` pattern has that), as htsim's all-to-all benchmarks run it."""
    order = _pick_hosts(fabric, hosts, plane)
    trace = _Trace(start_s, tclass, qp)
    for a in order:
        for b in order:
            if a != b:
                trace.add(a, b, size, "all-to-all")
    return trace.messages


# -- ring collectives --------------------------------------------------------------------------------------
def _ring(fabric: Fabric, phases: Sequence[str], size: int, hosts: Sequence[str] | None, plane: int | None,
          start_s: float, tclass: int, qp: int) -> list[Message]:
    """N-1 steps per phase; each host sends ceil(size/N) to its successor once it has received the previous
    step's chunk from its predecessor (the only dependency: the chunk it forwards or reduces)."""
    ring = _pick_hosts(fabric, hosts, plane)
    n = len(ring)
    chunk = -(-size // n)
    trace = _Trace(start_s, tclass, qp)
    got: dict[str, int] = {}
    for tag in phases:
        for _ in range(n - 1):
            step = {}
            for i, src in enumerate(ring):
                dst = ring[(i + 1) % n]
                step[dst] = trace.add(src, dst, chunk, tag, [got[src]] if src in got else [])
            got = step
    return trace.messages


def ring_allreduce(fabric: Fabric, *, size: int = 2 * MiB, hosts: Sequence[str] | None = None,
                   plane: int | None = None, start_s: float = 0.0, tclass: int = 0, qp: int = 1) -> list[Message]:
    """Ring all-reduce of `size` bytes: reduce-scatter then all-gather, 2(N-1) chained steps of size/N."""
    return _ring(fabric, ["ring-allreduce/reduce-scatter", "ring-allreduce/allgather"], size, hosts, plane,
                 start_s, tclass, qp)


def allgather(fabric: Fabric, *, size: int = 2 * MiB, hosts: Sequence[str] | None = None, plane: int | None = None,
              start_s: float = 0.0, tclass: int = 0, qp: int = 1) -> list[Message]:
    """Ring all-gather of a `size`-byte result (size/N from each host): N-1 chained steps."""
    return _ring(fabric, ["allgather"], size, hosts, plane, start_s, tclass, qp)


def reduce_scatter(fabric: Fabric, *, size: int = 2 * MiB, hosts: Sequence[str] | None = None,
                   plane: int | None = None, start_s: float = 0.0, tclass: int = 0, qp: int = 1) -> list[Message]:
    """Ring reduce-scatter of `size` bytes per host (each ends with a reduced size/N): N-1 chained steps."""
    return _ring(fabric, ["reduce-scatter"], size, hosts, plane, start_s, tclass, qp)


# -- storage -----------------------------------------------------------------------------------------------
def storage(fabric: Fabric, *, chunk_bytes: int = 128 * KiB, reads: int = 4, writes: int = 2, seed: int = 0,
            start_s: float = 0.0, tclass: int = 0, qp: int = 1) -> list[Message]:
    """3FS-style chunk I/O on the storage plane: each client's file is striped round robin over the servers from
    a seeded random first server; it reads chunks 0..reads-1 (server -> client) and writes the next `writes`
    (client -> server). Chain replication between servers is not modelled."""
    clients, servers = fabric.hosts("storage_client"), fabric.hosts("storage_server")
    if not clients or not servers:
        raise UserError("the fabric has no storage plane (build mpft with storage=true)", field="storage")
    if reads + writes < 1:
        raise UserError("needs at least one read or write", field="reads")
    rng = random.Random(seed)
    trace = _Trace(start_s, tclass, qp)
    for client in clients:
        first = rng.randrange(len(servers))
        for j in range(reads + writes):
            server = servers[(first + j) % len(servers)]
            if j < reads:
                trace.add(server, client, chunk_bytes, "storage/read")
            else:
                trace.add(client, server, chunk_bytes, "storage/write")
    return trace.messages


# -- ordering under spraying -------------------------------------------------------------------------------
def write_flag(fabric: Fabric, *, pairs: int | None = None, rounds: int = 8, size: int = 256 * KiB,
               flag_bytes: int = 64, shift: int | None = None, hosts: Sequence[str] | None = None,
               plane: int | None = None, start_s: float = 0.0, tclass: int = 0, qp: int = 1) -> list[Message]:
    """The paper's ordering case (section 6.4), `rounds` times: an RDMA write of `size` bytes, then a `flag_bytes`
    send on the same queue pair telling the receiver the data is there; all posted at `start_s` without
    dependencies, so only the transport's ordering mode keeps a flag behind its data. Each host sends to the host
    `shift` ahead of it among the chosen hosts of its plane (default: half-way round, on another leaf when the
    plane has several); `pairs` keeps the first senders only, in host order. Tags: data and flag."""
    by_plane: dict[int, list[str]] = defaultdict(list)
    for h in _pick_hosts(fabric, hosts, plane):
        by_plane[fabric.node(h)["plane"]].append(h)
    routes = []
    for p, group in by_plane.items():
        n = len(group)
        step = n // 2 if shift is None else shift
        if step % n == 0:
            raise UserError(f"a shift of {step} over the {n} hosts of plane {p} sends every host to itself",
                            field="shift")
        routes += [(h, group[(i + step) % n]) for i, h in enumerate(group)]
    if pairs is not None:
        if pairs > len(routes):
            raise UserError(f"only {len(routes)} hosts can send, asked for {pairs}", field="pairs")
        routes = routes[:pairs]
    trace = _Trace(start_s, tclass, qp)
    for _ in range(rounds):
        for src, dst in routes:
            trace.add(src, dst, size, "data")
            trace.add(src, dst, flag_bytes, "flag", op="send")
    return trace.messages


def mix(*schedules: Sequence[Message]) -> list[Message]:
    """One schedule of several, in the order given: ids renumbered 0..n-1, deps follow, start times kept."""
    merged: list[Message] = []
    for messages in schedules:
        new_id = {}
        for msg in schedule.check(messages):
            new_id[msg.id] = len(merged)
            merged.append(replace(msg, id=len(merged), deps=tuple(new_id[d] for d in msg.deps)))
    return merged


# -- registry ----------------------------------------------------------------------------------------------
PATTERNS: dict[str, Callable[..., list[Message]]] = {
    "moe": moe, "incast": incast, "flow": flow, "permutation": permutation, "all-to-all": all_to_all,
    "ring-allreduce": ring_allreduce,
    "allgather": allgather, "reduce-scatter": reduce_scatter, "storage": storage, "write-flag": write_flag,
}

# One meaning per parameter name, whichever pattern takes it: (low, high) of an integer or a number.
_INTS = {"tokens_per_gpu": (1, 1 << 20), "hidden": (1, 1 << 20), "top_k": (1, 1 << 16),
         "experts_per_gpu": (1, 1 << 16), "node_limit": (1, naming.MAX_NODES), "senders": (1, 1 << 20),
         "shift": (-(1 << 20), 1 << 20), "size": (1, 1 << 40), "chunk_bytes": (1, 1 << 40), "reads": (0, 1 << 20),
         "writes": (0, 1 << 20), "seed": (0, (1 << 63) - 1), "plane": (0, naming.MAX_PLANES - 1),
         "tclass": (0, 7), "qp": (1, MAX_QP), "pairs": (1, 1 << 20), "rounds": (1, 1 << 20),
         "flag_bytes": (1, 1 << 40)}
_NUMBERS = {"scale": (1e-9, 1e9), "start_s": (0.0, 1e6)}
_CHOICES = {"kind": ("random", "shift")}


def _check_value(key: str, value: Any) -> None:
    if key in _INTS:
        low, high = _INTS[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise UserError(f"must be a whole number from {low} to {high}, got {value!r}", field=key)
    elif key in _NUMBERS:
        low, high = _NUMBERS[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise UserError(f"must be a number from {low:g} to {high:g}, got {value!r}", field=key)
    elif key in _CHOICES:
        if value not in _CHOICES[key]:
            raise UserError(f"must be one of {', '.join(_CHOICES[key])}, got {value!r}", field=key)
    elif key in ("receiver", "src", "dst"):
        if not isinstance(value, str):
            raise UserError(f"must be a host name, got {value!r}", field=key)
    elif key == "hosts":
        if not isinstance(value, list) or not all(isinstance(h, str) for h in value):
            raise UserError(f"must be a list of host names, got {value!r}", field=key)


def check_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """User-supplied pattern parameters, checked by name and value before anything is generated."""
    if name not in PATTERNS:
        raise UserError(f"unknown pattern {name!r} (choose from {', '.join(PATTERNS)})", field="pattern")
    signature = inspect.signature(PATTERNS[name]).parameters
    allowed = [p for p in signature if p != "fabric"]
    for key, value in params.items():
        if key not in allowed:
            raise UserError(f"pattern {name} has no parameter {key!r} (it takes {', '.join(allowed)})", field=key)
        if value is None and signature[key].default is None:
            continue
        _check_value(key, value)
    return dict(params)


def takes_seed(name: str) -> bool:
    return "seed" in inspect.signature(PATTERNS[name]).parameters


def generate(name: str, fabric: Fabric, seed: int | None = None, **params: Any) -> list[Message]:
    """A pattern by name with checked parameters, its schedule checked against the fabric's hosts. `seed` is
    the run's: a pattern that draws at random uses it unless its own parameters fix one."""
    if seed is not None and takes_seed(name):
        params.setdefault("seed", seed)
    messages = PATTERNS[name](fabric, **check_params(name, params))
    if not messages:
        raise UserError(f"pattern {name} with these parameters sends nothing", field="pattern")
    return schedule.check(messages, fabric.hosts())

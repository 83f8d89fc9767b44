"""HPCC's ns-3 inputs (alibaba-edu/High-Precision-Congestion-Control): flow files, topologies, flow-size CDFs,
and a Poisson flow generator like its traffic_gen.py.

Flow file (`flow.txt`): the count N, then N flows `src dst pg dport size_bytes start_time_s`. Like the
simulator (scratch/third.cc) the file is read as whitespace-separated tokens and only the first N flows count;
whatever follows (the shipped file has 256 flows under N=2, then a text explanation) is reported as ignored.

Mapping to the fabric (`read_flows`):
- node ids go to `hosts` in order (pass `fabric.hosts(role='gpu')`): without a topology, the distinct ids of the
  flows read, sorted; with one (`read_topology`), all its host ids (nodes that are not switches), sorted, so an
  id keeps its host whichever flows are read. Ids beyond the last host have no host: their flows are dropped
  and reported, as a researcher running a 320-host workload on a smaller fabric expects a subset, not a refusal.
- start times become relative to the first flow's; they must not decrease (ns-3 cannot schedule the past).
- pg (priority group) is the traffic class, values above 7 clipped to 7 and counted; dport is not used.
- every flow gets its own queue pair, as each is its own RDMA connection in HPCC.
"""

from __future__ import annotations

import bisect
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from emulator.model.errors import UserError, read_file
from emulator.model.schedule import MAX_QP, Message, check

_INT = re.compile(r"[+-]?\d+", re.ASCII)
_NUM = r"(?P<num>\+?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?)"  # what C++ >> reads as a double, without a sign
_FLOAT = re.compile(_NUM, re.ASCII)
_RATE = re.compile(_NUM + r"(?P<unit>[KMG]?)bps", re.ASCII)  # ns-3 DataRate
_DELAY = re.compile(_NUM + r"(?P<unit>s|ms|us|ns)", re.ASCII)  # ns-3 Time
_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
FLOW_FIELDS = ("src", "dst", "pg", "dport", "size", "start_time")
MAX_TCLASS = 7


def _number(tok: str, pattern: re.Pattern = _FLOAT) -> float | None:
    match = pattern.fullmatch(tok)
    if not match or not math.isfinite(float(match["num"])):
        return None
    return float(match["num"]) * _SCALE[match.groupdict().get("unit") or ""]


class _Tokens:
    """Whitespace-separated tokens with their line numbers, read the way C++ `>>` reads ns-3's input files."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        text = read_file(path, what)
        self.items = [(tok, n) for n, line in enumerate(text.split("\n"), start=1) for tok in line.split()]
        self.pos = 0

    def _next(self, name: str, what: str) -> tuple[str, int]:
        if self.pos == len(self.items):
            last = self.items[-1][1] if self.items else 1
            raise UserError(f"file ends where {what} was expected", file=str(self.path), line=last, field=name)
        self.pos += 1
        return self.items[self.pos - 1]

    def int(self, name: str, lo: int = 0, hi: int | None = None) -> tuple[int, int]:
        tok, line = self._next(name, "an integer")
        if not _INT.fullmatch(tok) or int(tok) < lo or (hi is not None and int(tok) > hi):
            bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise UserError(f"must be an integer {bound}, got {tok[:40]!r}", file=str(self.path), line=line,
                            field=name)
        return int(tok), line

    def number(self, name: str, pattern: re.Pattern = _FLOAT) -> tuple[float, int]:
        """A finite number >= 0, scaled to bps or seconds when the pattern has a unit."""
        tok, line = self._next(name, "a number")
        value = _number(tok, pattern)
        if value is None:
            raise UserError(f"must be a number >= 0{' with a unit' if pattern is not _FLOAT else ''}, got "
                            f"{tok[:40]!r}", file=str(self.path), line=line, field=name)
        return value, line

    def ignored_lines(self) -> int:
        """Lines holding tokens that were not read: what the simulator would silently skip."""
        return len({line for _tok, line in self.items[self.pos:]})


# -- topology ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Link:
    a: int
    b: int
    bps: float
    delay_s: float
    error_rate: float


@dataclass
class Topology:
    nodes: int
    switches: frozenset[int]
    links: list[Link]
    lines_ignored: int = 0

    @property
    def host_ids(self) -> list[int]:
        return [i for i in range(self.nodes) if i not in self.switches]


def read_topology(path: str | Path) -> Topology:
    """`nodes switches links`, the switch ids, then `links` lines `a b rate delay error_rate` (e.g. 100Gbps 1000ns)."""
    toks = _Tokens(Path(path), "HPCC topology")
    nodes, _ = toks.int("nodes")
    n_switches, _ = toks.int("switches")
    n_links, _ = toks.int("links")
    switches = frozenset(toks.int("switch id", 0, nodes - 1)[0] for _ in range(n_switches))
    links = []
    for _ in range(n_links):
        a, _ = toks.int("src", 0, nodes - 1)
        b, _ = toks.int("dst", 0, nodes - 1)
        rate, _ = toks.number("rate", _RATE)
        delay, _ = toks.number("delay", _DELAY)
        error, _ = toks.number("error_rate")
        links.append(Link(a, b, rate, delay, error))
    return Topology(nodes, switches, links, toks.ignored_lines())


# -- flows -------------------------------------------------------------------------------------------------
@dataclass
class FlowImport:
    """The messages and what the import left out, for the run's report."""

    messages: list[Message]
    flows_read: int
    lines_ignored: int  # lines after the N-th flow, which the simulator never reads
    ids_without_host: list[int] = field(default_factory=list)
    flows_dropped: int = 0  # flows with an end in ids_without_host
    pg_clipped: int = 0
    host_of: dict[int, str] = field(default_factory=dict)

    def summary(self) -> str:
        parts = [f"{self.flows_read} flows read, {len(self.messages)} messages",
                 f"{self.lines_ignored} lines after the last flow ignored"]
        if self.ids_without_host:
            ids = ", ".join(map(str, self.ids_without_host[:10])) + (" ..." if len(self.ids_without_host) > 10 else "")
            parts.append(f"{self.flows_dropped} flows dropped: node ids without a host: {ids}")
        if self.pg_clipped:
            parts.append(f"{self.pg_clipped} flows with pg > {MAX_TCLASS} sent as traffic class {MAX_TCLASS}")
        return ", ".join(parts)


def read_flows(path: str | Path, hosts: Sequence[str], topology: Topology | None = None) -> FlowImport:
    """An HPCC flow file as messages between `hosts` (see the module docstring for the mapping)."""
    path = Path(path)
    toks = _Tokens(path, "HPCC flow file")
    count, _ = toks.int("flow count")
    flows = []
    for _ in range(count):
        flow = {}
        for name in FLOW_FIELDS[:-1]:
            flow[name], line = toks.int(name, 1 if name == "size" else 0)
            flow.setdefault("line", line)
        flow["start"], line = toks.number("start_time")
        where = {"file": str(path), "line": line}
        if flows and flow["start"] < flows[-1]["start"]:
            raise UserError(f"{flow['start']:g} is before the previous flow's {flows[-1]['start']:g}: HPCC needs "
                            "flows in ascending start_time", field="start_time", **where)
        if flow["src"] == flow["dst"]:
            raise UserError(f"source and destination are both node {flow['src']}", field="dst", **where)
        if topology is not None:
            for end in ("src", "dst"):
                if flow[end] >= topology.nodes or flow[end] in topology.switches:
                    raise UserError(f"node {flow[end]} is not a host of the topology", field=end, **where)
        flows.append(flow)
    if not flows:
        raise UserError("the flow file declares 0 flows", file=str(path), line=1, field="flow count")
    ids = topology.host_ids if topology is not None else sorted({f[e] for f in flows for e in ("src", "dst")})
    host_of = dict(zip(ids, hosts, strict=False))
    result = FlowImport([], len(flows), toks.ignored_lines(), host_of=host_of)
    result.ids_without_host = sorted({f[e] for f in flows for e in ("src", "dst")} - set(host_of))
    lines = []
    for i, flow in enumerate(flows):
        if flow["src"] not in host_of or flow["dst"] not in host_of:
            result.flows_dropped += 1
            continue
        lines.append(flow["line"])
        result.pg_clipped += flow["pg"] > MAX_TCLASS
        result.messages.append(Message(id=len(result.messages), start_s=flow["start"] - flows[0]["start"],
                                       src=host_of[flow["src"]], dst=host_of[flow["dst"]], bytes=flow["size"],
                                       tclass=min(flow["pg"], MAX_TCLASS), qp=i % MAX_QP + 1, tag="hpcc"))
    if not result.messages:
        raise UserError(f"no flow has both ends on a fabric host ({result.summary()})", file=str(path))
    check(result.messages, hosts, file=str(path), lines=lines)
    return result


# -- flow sizes and generated traffic ----------------------------------------------------------------------
@dataclass(frozen=True)
class Cdf:
    """Flow-size distribution: (size_bytes, cumulative_percent) points, from (x, 0) to (x, 100), rising."""

    points: tuple[tuple[float, float], ...]

    @property
    def mean(self) -> float:
        """Trapezoidal mean, as traffic_gen's CustomRand.getAvg (the size a flow has on average)."""
        pts = self.points
        return sum((x0 + x1) / 2 * (y1 - y0) for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False)) / 100


def read_cdf(path: str | Path) -> Cdf:
    """One `size cumulative_percent` pair a line; checked as traffic_gen's CustomRand.testCdf does."""
    path = Path(path)
    points: list[tuple[float, float]] = []
    for number, raw in enumerate(read_file(path, "flow-size CDF").split("\n"), start=1):
        toks = raw.split()
        if not toks:
            continue
        where = {"file": str(path), "line": number}
        values = [_number(t) for t in toks]
        if len(values) != 2 or None in values:
            raise UserError(f"expected `size cumulative_percent` (numbers >= 0), got {raw.strip()[:60]!r}", **where)
        x, y = values
        if not points and y != 0:
            raise UserError(f"the first point must be at 0 %, got {y:g}", field="cumulative_percent", **where)
        if points and (x <= points[-1][0] or y <= points[-1][1]):
            raise UserError("size and percent must both rise from the previous line", **where)
        if y > 100:
            raise UserError(f"must be at most 100, got {y:g}", field="cumulative_percent", **where)
        points.append((x, y))
    if not points or points[-1][1] != 100:
        raise UserError("the last point must be at 100 %", file=str(path), field="cumulative_percent")
    return Cdf(tuple(points))


def sample_sizes(cdf: Cdf, n: int, seed: int | None = None) -> list[int]:
    """n flow sizes drawn like traffic_gen: a uniform percentile, interpolated linearly, truncated, at least 1."""
    size = _sampler(cdf, random.Random(seed))
    return [size() for _ in range(n)]


def _sampler(cdf: Cdf, rng: random.Random) -> Callable[[], int]:
    ys = [y for _x, y in cdf.points]

    def size() -> int:
        y = rng.random() * 100
        i = max(1, bisect.bisect_left(ys, y))
        (x0, y0), (x1, y1) = cdf.points[i - 1], cdf.points[i]
        return max(1, int(x0 + (x1 - x0) / (y1 - y0) * (y - y0)))
    return size


def generate(cdf: Cdf, hosts: Sequence[str], load: float, host_bps: float, duration_s: float,
             seed: int | None = None, tclass: int = 3) -> list[Message]:
    """Poisson flow arrivals at every host, as traffic_gen.py: each host starts flows to a uniformly random other
    host with exponential gaps of mean cdf.mean * 8 / (host_bps * load), so it offers `load` of its link on
    average; flows start in [0, duration_s]. tclass 3 is the pg traffic_gen writes."""
    if len(hosts) < 2:
        raise UserError(f"need at least 2 hosts, got {len(hosts)}", field="hosts")
    if not 0 < load <= 1:
        raise UserError(f"must be in (0, 1], got {load}", field="load")
    if not host_bps > 0 or not duration_s > 0:
        raise UserError("host_bps and duration_s must be > 0", field="host_bps" if not host_bps > 0 else "duration_s")
    rng = random.Random(seed)
    size = _sampler(cdf, rng)
    rate = host_bps * load / 8 / cdf.mean  # flows per second per host
    flows = []
    for src in range(len(hosts)):
        t = rng.expovariate(rate)
        while t <= duration_s:
            dst = rng.randrange(len(hosts) - 1)
            flows.append((t, src, dst + (dst >= src), size()))
            t += rng.expovariate(rate)
    flows.sort()
    return [Message(id=i, start_s=t, src=hosts[s], dst=hosts[d], bytes=size, tclass=tclass, qp=i % MAX_QP + 1,
                    tag="hpcc-gen") for i, (t, s, d, size) in enumerate(flows)]

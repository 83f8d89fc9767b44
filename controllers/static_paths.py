"""Collision-free spine assignment for a known traffic pattern on two-tier planes (the paper's third option).

Pure functions, no OpenFlow (controllers/static.py turns the assignment into flows). On a leaf-spine plane a
flow between two leaves is fixed by its spine, and two flows collide when they share a leaf->spine or a
spine->leaf link. Choosing the spine by destination alone avoids the second but not the first, so the spines
come from an edge colouring of the bipartite demand multigraph (source leaves | destination leaves, one edge
per flow): by König's theorem max-degree colours suffice, one colour per spine.

A flow to another plane enters that plane at the leaf of the same-node GPU on it (PXN), so that is its source
leaf. A pattern with more cross-fabric flows at a leaf than spines (an all-to-all) cannot be collision-free;
`balanced` assigns it anyway, colour c to spine c mod S, which puts at most ceil(degree / S) flows on a link.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Hashable
from pathlib import Path

from emulator.model.errors import UserError, load_json
from emulator.model.fabric import Fabric

Pair = tuple[str, str]
Assignment = dict[Pair, str]  # (src host, dst host) -> spine


def leaf_of(fabric: Fabric, host: str) -> str:
    """The leaf of a host's NIC on the host's own plane."""
    return fabric.nic_on_plane(host, fabric.node(host)["plane"])


def entry_leaf(fabric: Fabric, src: str, dst: str) -> str:
    """The leaf where a src->dst flow enters the destination's plane: src's own NIC there, or PXN's relay's."""
    plane = fabric.node(dst)["plane"]
    leaf = fabric.nic_on_plane(src, plane)
    if leaf is None:
        domain = fabric.nvlink_peer(src)
        relay = next((g for g in fabric.node_gpus(domain) if plane in fabric.nic_planes(g)), None) if domain else None
        if relay is None:
            raise UserError(f"{src} cannot reach plane {plane} of {dst}", field="pairs")
        leaf = fabric.nic_on_plane(relay, plane)
    return leaf


def plane_spines(fabric: Fabric, plane: int) -> list[str]:
    """Spines of a two-tier plane in index order (colour c is spine c); other planes cannot be coloured."""
    leaves = fabric.switches(role="leaf", plane=plane)
    spines = sorted(fabric.switches(role="spine", plane=plane), key=lambda s: fabric.node(s)["index"])
    if fabric.switches(role="core", plane=plane) or not all(
            fabric.graph.has_edge(leaf, spine) for leaf in leaves for spine in spines):
        raise UserError(f"plane {plane} is not a two-tier leaf-spine plane; static routing needs one",
                        field="topo")
    return spines


def edge_colouring(edges: list[tuple[Hashable, Hashable]]) -> list[int]:
    """Colours 0..max degree - 1 for the edges (left, right) of a bipartite multigraph, distinct at every vertex.

    Edges are coloured one at a time. When no colour is free at both ends, take `a` free at the left end and
    `b` free at the right end and swap a and b along the a/b alternating path from the right end (a Kempe
    chain); in a bipartite graph that path never reaches the left end, so afterwards `a` is free at both.
    Left and right vertices need distinct keys even when they name the same leaf.
    """
    colours = max(_degrees(edges).values(), default=0)
    at: dict[Hashable, dict[int, int]] = defaultdict(dict)  # vertex -> colour -> edge index
    colour = [-1] * len(edges)

    def paint(e: int, c: int) -> None:
        colour[e] = c
        for end in edges[e]:
            at[end][c] = e

    for e, (u, v) in enumerate(edges):
        a = next(c for c in range(colours) if c not in at[u])
        if a in at[v]:
            b = next(c for c in range(colours) if c not in at[v])
            path, x, c = [], v, a
            while c in at[x]:
                f = at[x][c]
                path.append(f)
                x = edges[f][0] if edges[f][1] == x else edges[f][1]
                c = b if c == a else a
            for f in path:
                for end in edges[f]:
                    del at[end][colour[f]]
            for f in path:
                paint(f, b if colour[f] == a else a)
        paint(e, a)
    return colour


def assign_spines(fabric: Fabric, pairs: list[Pair], balanced: bool = False) -> Assignment:
    """A spine for every flow between different leaves of one two-tier plane, no two sharing a link (or, if
    `balanced`, as few as the pattern allows).

    Same-leaf flows need no spine and are left out; a repeated pair is one flow (pinned flows match addresses).
    """
    by_plane: dict[int, list[Pair]] = defaultdict(list)
    for src, dst in pairs:
        if entry_leaf(fabric, src, dst) != leaf_of(fabric, dst):
            by_plane[fabric.node(dst)["plane"]].append((src, dst))
    assignment: Assignment = {}
    for plane, flows in sorted(by_plane.items()):
        flows = list(dict.fromkeys(flows))
        spines = plane_spines(fabric, plane)
        edges = [(("src", entry_leaf(fabric, s, d)), ("dst", leaf_of(fabric, d))) for s, d in flows]
        if not balanced:
            _check_degree(edges, len(spines), plane)
        assignment.update(zip(flows, (spines[c % len(spines)] for c in edge_colouring(edges)), strict=True))
    return assignment


def _degrees(edges: list[tuple[Hashable, Hashable]]) -> dict[Hashable, int]:
    degree: dict[Hashable, int] = defaultdict(int)
    for u, v in edges:
        degree[u] += 1
        degree[v] += 1
    return degree


def _check_degree(edges: list[tuple[Hashable, Hashable]], spines: int, plane: int) -> None:
    """König's bound is tight: a leaf with more cross-fabric flows than spines must share an uplink."""
    (side, leaf), most = max(_degrees(edges).items(), key=lambda item: item[1])
    if most > spines:
        verb = "sends" if side == "src" else "receives"
        raise UserError(f"cannot be routed collision-free on plane {plane}: leaf {leaf} {verb} {most} flows "
                        f"across the fabric but the plane has {spines} spines", field="pattern")


def load_pattern(path: Path) -> tuple[list[Pair], bool]:
    """Pairs from a JSON pattern file, `{"pairs": [["n0g0", "n5g0"], ...], "balanced": false}`, and whether a
    pattern that cannot be collision-free is to be balanced; host names are checked later."""
    data = load_json(path, "pattern")
    if not isinstance(data, dict) or not isinstance(data.get("pairs"), list):
        raise UserError('expected an object with a list "pairs"', file=str(path), field="pairs")
    balanced = data.get("balanced", False)
    if not isinstance(balanced, bool):
        raise UserError(f"must be true or false, got {balanced!r}", file=str(path), field="balanced")
    pairs = []
    for i, entry in enumerate(data["pairs"]):
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(h, str) for h in entry)):
            raise UserError(f"expected [source, destination] host names, got {entry!r}", file=str(path),
                            field=f"pairs[{i}]")
        pairs.append((entry[0], entry[1]))
    return pairs, balanced


def save_pattern(path: Path, pairs: list[Pair], balanced: bool = False) -> Path:
    """Write the pattern file load_pattern reads (the static app's MPFT_PATTERN)."""
    Path(path).write_text(json.dumps({"pairs": [list(pair) for pair in pairs], "balanced": balanced}))
    return Path(path)


def check_pattern(fabric: Fabric, pairs: list[Pair], source: str | None = None) -> None:
    """Refuse pairs naming no host of the model, or a host sending to itself."""
    for i, (src, dst) in enumerate(pairs):
        for name in (src, dst):
            if name not in fabric.graph or fabric.node(name)["kind"] != "host":
                raise UserError(f"unknown host {name!r}", file=source, field=f"pairs[{i}]")
        if src == dst:
            raise UserError(f"{src} sends to itself", file=source, field=f"pairs[{i}]")


def assign_from_file(fabric: Fabric, path: Path) -> Assignment:
    """Load, check and assign a pattern file; any error names the file."""
    pairs, balanced = load_pattern(path)
    try:
        check_pattern(fabric, pairs)
        return assign_spines(fabric, pairs, balanced)
    except UserError as exc:
        raise UserError(exc.message, file=str(path), field=exc.field) from None


def permutation(fabric: Fabric, plane: int, seed: int = 0, shift: int | None = None) -> list[Pair]:
    """A permutation among the hosts of one plane in index order: host i -> host i + shift, or a seeded shuffle.

    Hosts mapped to themselves send nothing, so they are left out.
    """
    if plane not in fabric.planes:
        raise UserError(f"no plane {plane} (planes: {fabric.planes})", field="plane")
    hosts = sorted(fabric.hosts(plane=plane), key=lambda h: fabric.node(h)["index"])
    if shift is None:
        targets = list(hosts)
        random.Random(seed).shuffle(targets)
    else:
        targets = [hosts[(i + shift) % len(hosts)] for i in range(len(hosts))]
    return [(src, dst) for src, dst in zip(hosts, targets, strict=True) if src != dst]

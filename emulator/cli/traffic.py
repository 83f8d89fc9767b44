"""`mpft traffic` and `mpft replay`: run a generated pattern or a trace with the RDMA-like transport."""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path
from typing import Any

from emulator.model.errors import UserError


def add_transport_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("transport and routing")
    g.add_argument("--app", default="ecmp", help="controller app: ecmp, spray, adaptive, static or a path")
    g.add_argument("--cc", default="none", help="congestion control: none, rtt, ecn (default none); with "
                   "--transport tcp a kernel algorithm such as cubic")
    g.add_argument("--transport", default="rdma", help="rdma (RoCEv2-like queue pairs) or tcp (kernel TCP)")
    g.add_argument("--ordering", default="psn", help="when writes and sends become visible: psn, fence, release, "
                   "none (default psn)")
    g.add_argument("--entropy", default="fixed", help="UDP source port per packet: fixed, spray, random, flowlet")
    g.add_argument("--window", type=int, default=32, help="packets in flight per queue pair (default 32)")
    g.add_argument("--flowlet-gap-ms", type=float, default=20.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--timeout", type=float, help="give up after this many seconds (default from the schedule)")
    g.add_argument("--out", type=Path, help="results directory (default results/<time>)")


def parse_params(items: list[str]) -> dict[str, Any]:
    """`key=value` pairs; values are JSON where they parse (numbers, true, lists), else strings."""
    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"expected key=value, got {item!r}", field="--param")
        try:
            params[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            params[key.replace("-", "_")] = value
    return params


def _run(args: argparse.Namespace, fabric, messages) -> int:
    from emulator.cli.main import outdir_from_args
    from emulator.run import job
    from emulator.run.agents import TransportOptions

    options = TransportOptions(cc=args.cc, entropy=args.entropy, window=args.window,
                               flowlet_gap_ms=args.flowlet_gap_ms, transport=args.transport, ordering=args.ordering)
    outdir = outdir_from_args(args)
    metrics = job.run(fabric, messages, outdir, app=args.app, options=options, seed=args.seed,
                      timeout_s=args.timeout)
    print(job.format_report(metrics))
    print(f"results in {outdir}/ (traffic.json, messages.csv, schedule.jsonl: replay it with mpft replay)")
    return 0 if metrics["lost_messages"] == 0 else 1


def cmd_traffic(args: argparse.Namespace) -> int:
    from emulator.cli.main import fabric_from_args
    from traffic import patterns

    fabric = fabric_from_args(args)
    params = parse_params(args.param)
    if "seed" in inspect.signature(patterns.PATTERNS[args.pattern]).parameters:
        params.setdefault("seed", args.seed)
    messages = patterns.generate(args.pattern, fabric, **params)
    return _run(args, fabric, messages)


def cmd_replay(args: argparse.Namespace) -> int:
    from emulator.cli.main import fabric_from_args, outdir_from_args
    from traffic import replay

    fabric = fabric_from_args(args)
    if not args.trace.exists() and not Path(f"{args.trace}.0.et").exists():
        raise UserError("no such trace file", file=str(args.trace))
    fmt = replay.detect(args.trace) if args.format == "auto" else args.format
    if fmt != "pcap":
        messages, summary = replay.load_messages(args.trace, fabric, fmt, args.scale, args.hpcc_topology)
        print(f"{args.trace}: {summary}")
        return _run(args, fabric, messages)
    from emulator.net.emulation import Emulation
    from traffic import pcapreplay

    plan = pcapreplay.plan(args.trace, fabric, plane=args.plane)
    outdir = outdir_from_args(args)
    with Emulation(fabric, app=args.app, seed=args.seed) as emu:
        m = replay.replay_pcap(emu, plan, outdir)
    skipped = ", ".join(f"{n} {why}" for why, n in m["skipped"].items()) or "none"
    print(f"{args.trace}: {m['read']} frames read, {m['sent']} replayed over {m['duration_s']:.2f} s "
          f"(latest send {m['lag_max_s'] * 1e3:.1f} ms behind schedule), {m['delivered']} of "
          f"{m['expected_delivered']} delivered, {m['replies']} replies from the hosts' stacks; skipped: {skipped}")
    print(f"results in {outdir}/ (replay.json, plan.json)")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    from emulator.cli.main import add_topo_options
    from traffic import patterns

    p = sub.add_parser("traffic", help="run a traffic pattern with the RDMA-like transport and report it")
    p.add_argument("pattern", choices=sorted(patterns.PATTERNS))
    p.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                   help="pattern parameter, e.g. -p size=1048576 -p plane=0 (see README)")
    add_transport_options(p)
    add_topo_options(p)
    p.set_defaults(func=cmd_traffic)

    from traffic.traces import FORMATS

    p = sub.add_parser("replay", help="replay a trace (our JSONL, HPCC flow.txt, Chakra .et, pcap) on a fabric")
    p.add_argument("trace", type=Path, help="trace file (for Chakra: one rank's .et file or the common prefix)")
    p.add_argument("--format", choices=FORMATS, default="auto")
    p.add_argument("--scale", type=float, default=1.0, help="multiply message sizes (traces for faster fabrics)")
    p.add_argument("--plane", type=int, default=0, help="pcap: the plane whose hosts the addresses map onto")
    p.add_argument("--hpcc-topology", type=Path, help="HPCC: its topology file; its host ids map onto the hosts")
    add_transport_options(p)
    add_topo_options(p)
    p.set_defaults(func=cmd_replay)

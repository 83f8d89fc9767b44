"""`mpft traffic` and `mpft replay`: run a generated pattern or a trace with the RDMA-like transport."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from emulator.cli.options import (
    add_capture_options,
    add_server_options,
    add_topo_options,
    add_transport_options,
    auto_rate,
    capture_from_args,
    fabric_from_args,
    outdir_from_args,
    parse_params,
    servers_from_args,
    transport_from_args,
)
from emulator.model.errors import UserError
from emulator.model.fabric import Fabric
from emulator.model.schedule import Message
from emulator.net.emulation import Emulation
from emulator.run import autorate, job, pcap
from traffic import patterns, pcapreplay, traces


def _run(args: argparse.Namespace, fabric: Fabric, messages: list[Message],
         regenerate: Callable[[Fabric], list[Message]] | None = None) -> int:
    options = transport_from_args(args)
    servers, ssh_config = servers_from_args(args)
    fabric, predicted = auto_rate(args, fabric, messages, options.concrete_cc().cc, regenerate)
    outdir = outdir_from_args(args)
    metrics = job.run_job(fabric, messages, outdir, app=args.app, options=options, seed=args.seed,
                          timeout_s=args.timeout, capture=capture_from_args(args), controller=args.controller,
                          servers=servers, ssh_config=ssh_config, predicted=predicted)
    print(job.format_report(metrics))
    print(f"results in {outdir}/ (traffic.json, messages.csv, schedule.jsonl: replay it with mpft replay)")
    return 0 if metrics.lost_messages == 0 else 1


def cmd_traffic(args: argparse.Namespace) -> int:
    fabric = fabric_from_args(args, autorate.RATES[0])
    params = parse_params(args.param)
    messages = patterns.generate(args.pattern, fabric, seed=args.seed, **params)
    return _run(args, fabric, messages, lambda f: patterns.generate(args.pattern, f, seed=args.seed, **params))


def cmd_replay(args: argparse.Namespace) -> int:
    fabric = fabric_from_args(args, autorate.RATES[0])
    if not args.trace.exists() and not Path(f"{args.trace}.0.et").exists():
        raise UserError("no such trace file", file=str(args.trace))
    fmt = traces.detect(args.trace) if args.format == "auto" else args.format
    if fmt != "pcap":
        messages, summary = traces.load_messages(args.trace, fabric, fmt, args.scale, args.hpcc_topology,
                                                 args.comm_groups)
        print(f"{args.trace}: {summary}")
        return _run(args, fabric, messages)
    if args.link_mbps == "auto":
        raise UserError("a pcap replays at its own pace: give the rate", field="--link-mbps")
    if args.servers:
        raise UserError("a pcap replays on one machine: its frames go out of the hosts of one plane",
                        field="--servers")
    plan = pcapreplay.plan(args.trace, fabric, plane=args.plane)
    outdir = outdir_from_args(args)
    tap = capture_from_args(args)
    with Emulation(fabric, app=args.app, seed=args.seed, controller=args.controller) as emu:
        tapped = emu.start_capture(tap, outdir / "pcap") if tap else None
        try:
            m = pcap.replay_pcap(emu, plan, outdir)
        finally:
            if tapped:
                tapped.stop()
    skipped = ", ".join(f"{n} {why}" for why, n in m["skipped"].items()) or "none"
    print(f"{args.trace}: {m['read']} frames read, {m['sent']} replayed over {m['duration_s']:.2f} s "
          f"(latest send {m['lag_max_s'] * 1e3:.1f} ms behind schedule), {m['delivered']} of "
          f"{m['expected_delivered']} delivered, {m['replies']} replies from the hosts' stacks; skipped: {skipped}")
    print(f"results in {outdir}/ (replay.json, plan.json)")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("traffic", help="run a traffic pattern with the RDMA-like transport and report it")
    p.add_argument("pattern", choices=sorted(patterns.PATTERNS))
    p.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                   help="pattern parameter, e.g. -p size=1048576 -p plane=0; traffic/README.md lists them)")
    add_transport_options(p)
    add_capture_options(p)
    add_server_options(p)
    add_topo_options(p)
    p.set_defaults(func=cmd_traffic)

    p = sub.add_parser("replay",
                       help="replay a trace (our JSONL, HPCC flow.txt, Chakra .et, pcap or pcapng) on a fabric")
    p.add_argument("trace", type=Path, help="trace file (for Chakra: one rank's .et file or the common prefix)")
    p.add_argument("--format", choices=traces.FORMATS, default="auto")
    p.add_argument("--scale", type=float, default=1.0, help="multiply message sizes (traces for faster fabrics)")
    p.add_argument("--plane", type=int, default=0, help="pcap: the plane whose hosts the addresses map onto")
    p.add_argument("--hpcc-topology", type=Path, help="HPCC: its topology file; its host ids map onto the hosts")
    p.add_argument("--comm-groups", type=Path, metavar="JSON",
                   help='Chakra: process groups, as ASTRA-sim\'s communicator-group file {"<pg_name>": [rank, ...]}')
    add_transport_options(p)
    add_capture_options(p)
    add_server_options(p, "spread the planes over these servers (not for pcap)")
    add_topo_options(p)
    p.set_defaults(func=cmd_replay)

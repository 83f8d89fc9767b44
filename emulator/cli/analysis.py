"""Subcommands for the scale and limit analyses: `cost`, `decode-limit`, `node-limit` and `paths`.

Each prints an aligned table, or JSON with --json; bad values raise UserError, which the main CLI reports.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from emulator.analysis import limits, scale
from emulator.cli.options import add_topo_options, fabric_from_args
from emulator.study.report import text_table


def add_commands(subparsers: Any) -> None:
    """Register the analysis subcommands on an argparse subparsers object."""
    p = subparsers.add_parser("cost", help="Table 3: scale and cost of FT2, MPFT, FT3, Slim Fly, Dragonfly")
    p.add_argument("--radix", type=int, default=scale.PAPER_RADIX, help="switch ports (default 64)")
    _json_flag(p)
    p.set_defaults(func=cost_command)

    p = subparsers.add_parser("decode-limit", help="expert-parallel decode bound from scale-out bandwidth")
    p.add_argument("--bandwidth", type=float, nargs="+", default=[50.0, 900.0], metavar="GBPS",
                   help="GB/s per device, GB = 10^9 bytes (default 50 900)")
    p.add_argument("--tokens", type=int, default=32, help="tokens per device (default 32)")
    p.add_argument("--hidden", type=int, default=7000, help="hidden size (default 7000)")
    p.add_argument("--experts-per-token", type=int, default=9, help="routed + shared (default 9)")
    p.add_argument("--dispatch-bytes", type=float, default=1.0, help="bytes per element, FP8 (default 1)")
    p.add_argument("--combine-bytes", type=float, default=2.0, help="bytes per element, BF16 (default 2)")
    p.add_argument("--layers", type=int, default=61, help="default 61")
    p.add_argument("--micro-batches", type=int, default=2, help="overlapped micro-batches (default 2)")
    _json_flag(p)
    p.set_defaults(func=decode_limit_command)

    p = subparsers.add_parser("node-limit", help="scale-out bytes per token with node-limited routing")
    p.add_argument("--experts", type=int, default=256, help="routed experts (default 256)")
    p.add_argument("--nodes", type=int, default=8, help="nodes the experts are spread over (default 8)")
    p.add_argument("--top-k", type=int, default=8, help="routed experts per token (default 8)")
    p.add_argument("--limit", type=int, default=4, help="M, most nodes per token (default 4)")
    p.add_argument("--hidden", type=int, default=7000, help="hidden size (default 7000)")
    p.add_argument("--bytes", type=float, default=1.0, help="bytes per element of dispatch (default 1)")
    _json_flag(p)
    p.set_defaults(func=node_limit_command)

    p = subparsers.add_parser("paths", help="equal-cost paths of a fabric and random hashing versus spraying")
    add_topo_options(p)
    p.add_argument("--flows", type=int, help="flows hashed onto n paths (default: n)")
    p.add_argument("--seed", type=int, default=0, help="Monte-Carlo seed for the max load (default 0)")
    _json_flag(p)
    p.set_defaults(func=paths_command)


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> int:
    print(json.dumps(data, indent=2) if args.json else text)
    return 0


def cost_command(args: argparse.Namespace) -> int:
    params = scale.CostParams()
    rows = scale.cost_table(args.radix, params)
    table = text_table(
        ["topology", "endpoints", "switches", "links", "cost M$", "k$/endpoint", "paper k$", "deviation",
         "counts"],
        [[r.label, f"{r.endpoints:,}", f"{r.switches:,}", f"{r.links:,}", f"{r.cost_usd / 1e6:,.1f}",
          f"{r.cost_per_endpoint_usd / 1e3:.2f}",
          "-" if r.paper_kusd_per_endpoint is None else f"{r.paper_kusd_per_endpoint:.2f}",
          "-" if r.deviation is None else f"{r.deviation:+.1%}", r.source] for r in rows])
    text = (f"Table 3 at radix {args.radix} (links are switch-switch)\n{table}\n"
            f"cost (Slim Fly paper's method, one parameter set fitted to Table 3): switch "
            f"${params.usd_per_switch_port:,.0f}/port;\n  in-rack electric cable "
            f"${params.electric_usd:,.0f} + ${params.electric_usd_per_m:,.0f}/m ({params.in_rack_m:g} m); "
            f"optical ${params.optical_usd:,.0f} + ${params.optical_usd_per_m:,.0f}/m;\n"
            f"  {params.endpoints_per_rack} endpoints per rack, racks {params.rack_pitch_m:g} m apart on a "
            f"square grid, {params.riser_m:g} m riser")
    data = {"radix": args.radix, "params": asdict(params), "rows": [asdict(r) for r in rows]}
    return _emit(args, data, text)


def decode_limit_command(args: argparse.Namespace) -> int:
    results = [limits.decode_limit(bw, args.tokens, args.hidden, args.experts_per_token, args.dispatch_bytes,
                                   args.combine_bytes, args.layers, args.micro_batches)
               for bw in args.bandwidth]
    first = results[0]
    table = text_table(["GB/s", "exchange µs", "per token ms", "tokens/s"],
                   [[f"{r.bandwidth_gbps:g}", f"{r.exchange_us:.2f}", f"{r.token_ms:.2f}",
                     f"{r.tokens_per_s:,.1f}"] for r in results])
    text = (f"({first.dispatch_bytes:g} + {first.combine_bytes:g}) B x {first.tokens} tokens x "
            f"{first.experts_per_token} experts x {first.hidden:,} hidden = {first.exchange_bytes:,.0f} B "
            f"per exchange; {first.micro_batches} x {first.layers} layers per token\n{table}\n"
            "a theoretical bound: network latency excluded")
    return _emit(args, {"limits": [asdict(r) for r in results]}, text)


def node_limit_command(args: argparse.Namespace) -> int:
    r = limits.node_limit(args.experts, args.nodes, args.top_k, args.limit, args.hidden, args.bytes)
    table = text_table(["routing", "nodes per token", "scale-out bytes per token"], [
        ["unrestricted, worst case", r.worst_nodes_unrestricted, f"{r.bytes_worst_unrestricted:,.0f}"],
        ["unrestricted, expected", f"{r.expected_nodes_unrestricted:.3f}",
         f"{r.bytes_expected_unrestricted:,.0f}"],
        [f"node-limited (M = {r.limit}), worst case", r.worst_nodes_limited,
         f"{r.bytes_worst_limited:,.0f}"]])
    text = (f"{r.experts} experts on {r.nodes} nodes ({r.experts_per_node} per node), top-{r.top_k}, "
            f"{r.hidden:,} x {r.bytes_per_element:g} B per token copy\n{table}\n"
            f"without the limit {r.share_over_limit:.1%} of tokens would reach more than {r.limit} nodes")
    return _emit(args, asdict(r), text)


def paths_command(args: argparse.Namespace) -> int:
    fabric = fabric_from_args(args)
    classes = limits.path_classes(fabric)
    hashes = [limits.hashing(n, args.flows or n, seed=args.seed) for n in sorted({c.paths for c in classes})
              if n > 1]
    counts = fabric.counts()
    described = ", ".join(f"{k}={v}" for k, v in fabric.params.items() if v is not None and v is not False)
    text = (f"{fabric.topo} ({described}): {counts['planes']} planes, {counts['hosts']} hosts, "
            f"{counts['switches']} switches\nhost pairs sharing a plane:\n"
            + text_table(["equal-cost paths", "switches crossed", "host pairs"],
                     [[c.paths, c.switches, f"{c.pairs:,}"] for c in classes]))
    if hashes:
        text += (f"\nF flows hashed onto n paths versus sprayed ({hashes[0].trials} trials, "
                 f"seed {args.seed}; loads in flows per path)\n"
                 + text_table(["paths n", "flows F", "paths used (expected)", "max load hashed",
                           "max load sprayed"],
                          [[h.paths, h.flows, f"{h.used_fraction:.1%}", f"{h.max_load_hashed:.2f}",
                            f"{h.max_load_sprayed:.2f}"] for h in hashes]))
    data = {"topo": fabric.topo, "params": fabric.params, "counts": counts,
            "pair_classes": [asdict(c) for c in classes], "hashing": [asdict(h) for h in hashes]}
    return _emit(args, data, text)

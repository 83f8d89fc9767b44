"""`mpft`: the command line. User errors are printed as one line and exit with code 2."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from emulator.cli import analysis as analysis_cli
from emulator.cli import traffic as traffic_cli
from emulator.model import topologies
from emulator.model.errors import Terminated, UserError
from emulator.model.fabric import Fabric
from emulator.net import features

log = logging.getLogger("mpft")

# Builder parameters exposed as options: (flag, type, help)
TOPO_OPTIONS = [
    ("k", int, "switch radix (ft2, ft3, mpft)"),
    ("planes", int, "planes (mpft)"),
    ("nodes", int, "nodes (mpft, mrft)"),
    ("gpus", int, "GPUs per node (mrft; mpft has one GPU per plane)"),
    ("leaves", int, "leaves per plane (ft2, mpft)"),
    ("spines", int, "spines per plane (ft2, mpft, mrft)"),
    ("hosts_per_leaf", int, "hosts per leaf (ft2)"),
    ("leaves_per_rail", int, "leaves per rail (mrft)"),
    ("storage", bool, "add a storage plane (mpft)"),
    ("storage_servers", int, "storage servers (mpft --storage)"),
    ("multiport", bool, "every GPU's NIC has a port on every plane, at 1/planes of the link rate (mpft)"),
    ("link_mbps", float, "NIC and switch link rate in Mbit/s (default 10)"),
    ("nvlink_mbps", float, "NVLink rate in Mbit/s (default 4x the link rate)"),
    ("mtu", int, "MTU in bytes (default 9000)"),
    ("queue_kb", float, "egress queue limit in KiB (default 128)"),
    ("delay_ms", float, "one-way delay per link in ms (needs netem)"),
    ("loss_pct", float, "random loss per link in percent (needs netem)"),
    ("ecn", bool, "mark ECN with RED instead of dropping at a full FIFO (needs RED)"),
    ("queueing", str, "switch egress queues: fifo (one shared), class (one per traffic class), voq (one per queue "
                      "pair) (default fifo)"),
]


def add_topo_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("topology (default: mpft, 2 planes, 16 nodes x 2 GPUs)")
    group.add_argument("--topo", default=topologies.DEFAULT_TOPO, choices=sorted(topologies.BUILDERS))
    group.add_argument("--model", type=Path, help="load a fabric model JSON instead of building one")
    for name, kind, help_text in TOPO_OPTIONS:
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            group.add_argument(flag, action="store_true", default=None, help=help_text)
        else:
            group.add_argument(flag, type=kind, help=help_text)


def fabric_from_args(args: argparse.Namespace) -> Fabric:
    if args.model:
        return Fabric.load(args.model)
    params: dict[str, Any] = {name: getattr(args, name) for name, _, _ in TOPO_OPTIONS
                              if getattr(args, name) is not None}
    return topologies.build(args.topo, **params)


# -- commands -----------------------------------------------------------------------------------
def outdir_from_args(args: argparse.Namespace) -> Path:
    """--out, or a new directory under results/ named by the time."""
    return args.out or Path("results") / time.strftime("%Y%m%d-%H%M%S")


def cmd_topo(args: argparse.Namespace) -> int:
    started = time.monotonic()
    fabric = fabric_from_args(args)
    if args.save:
        try:
            fabric.save(args.save)
        except OSError as exc:
            raise UserError(f"cannot write the model: {exc.strerror}", file=str(args.save)) from None
    counts = fabric.counts()
    if args.json:
        print(json.dumps({"topo": fabric.topo, "params": fabric.params, **counts}))
    else:
        print(f"{fabric.topo} {fabric.params}")
        for key, value in counts.items():
            print(f"  {key:<15} {value:>8}")
        print(f"  built in {time.monotonic() - started:.2f} s")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    facts = features.probe()
    feats = features.decide(facts)
    report = {"ovs_running": facts.ovs_running, "ovs_version": facts.ovs_version,
              "datapaths": {"kernel": facts.ovs_kernel_module, "user": facts.ovs_running},
              "qdiscs": facts.qdiscs, "tcp_congestion": facts.tcp_congestion, "tools": facts.tools,
              "uses": {"datapath": feats.datapath, "shaping": feats.shaping, "link_delay": feats.link_delay,
                       "link_loss": feats.link_loss, "ecn_marking": feats.ecn_marking},
              "unavailable": feats.unavailable}
    if args.measure:
        from emulator.run.budget import measure_budget

        report["forwarding_budget"] = measure_budget()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    yes = {True: "yes", False: "no"}
    print(f"Open vSwitch: {'running ' + facts.ovs_version if facts.ovs_running else 'NOT running'}")
    print(f"datapaths: kernel {yes[facts.ovs_kernel_module]}, userspace {yes[facts.ovs_running]} "
          f"-> using {feats.datapath}")
    print("qdiscs: " + ", ".join(f"{k} {yes[v]}" for k, v in facts.qdiscs.items()))
    print("TCP congestion control: " + ", ".join(facts.tcp_congestion))
    print("tools: " + ", ".join(f"{k} {yes[v]}" for k, v in facts.tools.items()))
    print("unavailable here:")
    for item in feats.unavailable:
        print(f"  - {item}")
    if "forwarding_budget" in report:
        b = report["forwarding_budget"]
        print(f"forwarding budget on the default fabric ({b['ports']} OVS ports): {b['hops_per_s'] / 1e3:.0f} k "
              f"packet-hops/s ({b['pps'] / 1e3:.1f} k pps of {b['datagram']} B over {b['hops']} switches, one "
              f"saturating flow); its all-to-all at line rate needs about "
              f"{b['default_need_hops_per_s'] / 1e3:.0f} k ({b['default_share']:.0%}) before ACKs; sparse traffic "
              "costs more per packet (every wake-up polls every port)")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from mininet.cli import CLI
    from mininet.log import lg, setLogLevel

    from emulator.net.emulation import Emulation

    fabric = fabric_from_args(args)
    setLogLevel("info")  # the CLI's command output goes through Mininet's logger
    lg.propagate = False
    with Emulation(fabric, app=None if args.app == "none" else args.app, seed=args.seed,
                   app_env=app_env(args)) as emu:
        c = fabric.counts()
        print(f"*** {fabric.topo}: {c['hosts']} hosts, {c['switches']} switches, app {args.app}, "
              f"up in {emu.timings['up_s']:.1f} s; run dir {emu.directory}")
        CLI(emu.net)
    print(f"*** torn down in {emu.timings['down_s']:.1f} s")
    return 0


def app_env(args: argparse.Namespace) -> dict[str, str]:
    """Settings handed to the controller app (the static app's traffic pattern)."""
    if args.pattern is None:
        return {}
    if not args.pattern.is_file():
        raise UserError("no such pattern file", file=str(args.pattern), field="pattern")
    return {"MPFT_PATTERN": str(args.pattern.resolve())}


def cmd_controller(args: argparse.Namespace) -> int:
    from controllers import harness

    logging.getLogger().setLevel(logging.INFO)  # the controller's own log is what its user watches
    Fabric.load(args.model)
    argv = ["--app", harness.app_module(args.app), "--model", str(args.model), "--host", args.listen,
            "--port", str(args.port), "--seed", str(args.seed)]
    return harness.main(argv)


def cmd_run(args: argparse.Namespace) -> int:
    from emulator.study import report, scenario
    from emulator.study import runner as study

    loaded = scenario.load(args.study, quick=args.quick)
    seeds = [args.seed] if args.seed is not None else args.seeds
    outdir = outdir_from_args(args)
    metrics = study.run_study(loaded, outdir, seeds=seeds)
    print(report.format_table(metrics))
    print(f"report: {outdir / 'report.html'} (metrics.json, plots and one directory per run beside it)")
    return 0 if all(v["lost_messages"] == 0 for v in metrics["variants"].values()) else 1


def _seed_list(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seeds like 1,2,3, got {text!r}") from None
    if not seeds or any(not 0 <= s < 2**32 for s in seeds):
        raise argparse.ArgumentTypeError("seeds are whole numbers from 0 to 2**32-1")
    return seeds


def cmd_alltoall(args: argparse.Namespace) -> int:
    from emulator.run import alltoall

    fabric = fabric_from_args(args)
    outdir = outdir_from_args(args)
    report = alltoall.run(fabric, outdir, app=args.app, seconds=args.seconds, seed=args.seed,
                          congestion=args.cc, intra_node=args.intra_node)
    print(alltoall.format_report(report))
    print(f"results in {outdir}/ (pairs.csv, summary.json)")
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    from emulator.net import runstate

    cleaned = runstate.clean_dead_runs()
    if not cleaned:
        print("nothing to clean")
    for run_id, counts in cleaned:
        print(f"removed {run_id}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mpft", description="Multi-plane fat-tree network emulator")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("topo", help="build a fabric model and print its counts (nothing is started)")
    add_topo_options(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--save", type=Path, help="write the model JSON here")
    p.set_defaults(func=cmd_topo)

    p = sub.add_parser("doctor", help="what this machine's kernel and OVS offer, and what that enables")
    p.add_argument("--json", action="store_true")
    p.add_argument("--measure", action="store_true", help="also measure the OVS forwarding budget (root)")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("up", help="bring a fabric up and open the Mininet CLI (EOF tears it down)")
    add_topo_options(p)
    p.add_argument("--app", default="ecmp",
                   help="controller app: ecmp, spray, adaptive, static, a path to an app .py, or none")
    p.add_argument("--pattern", type=Path, help="traffic pattern JSON for --app static")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("controller", help="run a controller app alone, for a Mininet you start yourself")
    p.add_argument("--app", default="ecmp")
    p.add_argument("--model", type=Path, required=True, help="fabric model JSON (mpft topo --save)")
    p.add_argument("--listen", default="127.0.0.1", help="OpenFlow listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=6653)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_controller)

    p = sub.add_parser("run", help="run a study: every variant of a scenario on the same traffic, with a report")
    p.add_argument("study", nargs="?", default="routing",
                   help="a built-in study (routing, ...) or a scenario TOML file (default: routing)")
    p.add_argument("--out", type=Path, help="results directory (default results/<time>)")
    p.add_argument("--seed", type=int, help="run this one seed")
    p.add_argument("--seeds", type=_seed_list, help="run these seeds, e.g. 1,2,3 (default: the scenario's)")
    p.add_argument("--quick", action="store_true", help="the scenario's CI-sized version")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("alltoall", help="TCP all-to-all on the fabric with goodput vs the best possible")
    add_topo_options(p)
    p.add_argument("--app", default="ecmp")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cc", help="TCP congestion control for the flows (default: the kernel's)")
    p.add_argument("--intra-node", action="store_true", help="also the pairs inside a node (NVLink)")
    p.add_argument("--out", type=Path, help="results directory (default results/<time>)")
    p.set_defaults(func=cmd_alltoall)

    p = sub.add_parser("clean", help="remove leftovers of crashed runs (only ours; live runs are kept)")
    p.set_defaults(func=cmd_clean)

    analysis_cli.add_commands(sub)
    traffic_cli.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except UserError as exc:
        print(f"mpft: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mpft: interrupted; cleaned up", file=sys.stderr)
        return 130
    except Terminated:
        print("mpft: terminated; cleaned up", file=sys.stderr)
        return 143


if __name__ == "__main__":
    sys.exit(main())

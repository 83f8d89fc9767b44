"""`mpft topo`, `doctor`, `up`, `controller`, `alltoall` and `clean`: the fabric itself."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from mininet.cli import CLI
from mininet.log import lg, setLogLevel

from controllers.apps import app_module, is_ryu_app
from emulator.cli.options import (
    CONTROLLER_HELP,
    add_server_options,
    add_topo_options,
    app_env,
    fabric_from_args,
    outdir_from_args,
    servers_from_args,
)
from emulator.model.errors import UserError
from emulator.model.fabric import Fabric
from emulator.net import features, runstate
from emulator.net.cluster_run import emulation
from emulator.net.remote import Connection
from emulator.run import alltoall, autorate, budget


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
                       "link_loss": feats.link_loss, "ecn_marking": feats.ecn_marking,
                       "ecn_marker": feats.ecn_marker, "lossless": feats.lossless},
              "unavailable": feats.unavailable}
    if args.measure:
        report["forwarding_budget"] = budget.measure_budget()
        with tempfile.TemporaryDirectory(prefix="mpft-calibration-") as scratch:
            costs = autorate.measure_costs(Path(scratch))
        report["costs"] = {**asdict(costs), "saved_to": str(autorate.save_costs(costs))}
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
    marker = {"red": "RED", "bpf": "the eBPF marker (emulator/net/ecn_marker.bpf.c)"}.get(feats.ecn_marker)
    both = facts.qdiscs.get("red") and not facts.ecn_bpf_missing
    print(f"ECN marking (--ecn, --cc ecn): {'yes, by ' + marker if marker else 'no'}"
          + (" (MPFT_ECN_MARKER=red or bpf chooses: this kernel has both)" if both else ""))
    print(f"lossless links (--lossless): {'yes, by emulator/net/pause.py' if feats.lossless else 'no'}")
    print("unavailable here:")
    for item in feats.unavailable:
        print(f"  - {item}")
    if "forwarding_budget" in report:
        b = report["forwarding_budget"]
        print(f"forwarding budget on the default fabric ({b['ports']} OVS ports, switch daemons "
              f"{b['switch_daemons']}), {b['datagram']} B UDP across {b['hops']} switches:\n"
              f"  one plane alone, one flood: {b['instance_hops_per_s'] / 1e3:.0f} k packet-hops/s "
              f"({b['instance_pps'] / 1e3:.1f} k pps)\n  all {b['planes']} planes at once (the machine), "
              f"the most delivered with <= 2% lost: {b['hops_per_s'] / 1e3:.0f} k packet-hops/s "
              f"({b['pps'] / 1e3:.1f} k pps)\n"
              f"  its all-to-all at line rate needs about {b['default_need_hops_per_s'] / 1e3:.0f} k "
              f"({b['default_share']:.0%} of the machine's) before ACKs; sparse traffic costs more per packet "
              "(every wake-up polls every port of its daemon)")
    if "costs" in report:
        c = report["costs"]
        print(f"costs for --link-mbps auto ({c['source']}, saved to {c['saved_to']}): agents "
              f"{c['agent_s_per_datagram'] * 1e6:.0f} us CPU per datagram and "
              f"{c['agent_s_per_agent_second'] * 1e3:.1f} ms per agent-second; a switch daemon "
              f"{c['switch_s_per_hop_port'] * 1e9:.0f} ns per packet-hop and port it polls at sparse load, "
              f"the daemons {c['daemon_yield']:.0%} of the cores the agents leave; pull sends "
              f"{c['pull_datagrams_per_packet']:.1f} datagrams per data packet")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    fabric = fabric_from_args(args)
    servers, ssh_config = servers_from_args(args)
    setLogLevel("info")  # the CLI's command output goes through Mininet's logger
    lg.propagate = False
    with emulation(fabric, app=None if args.app == "none" else args.app, seed=args.seed,
                   app_env=app_env(args), controller=args.controller, servers=servers, ssh_config=ssh_config) as emu:
        c = fabric.counts()
        print(f"*** {fabric.topo}: {c['hosts']} hosts, {c['switches']} switches, "
              f"{'controller ' + args.controller if args.controller else 'app ' + args.app}, "
              f"up in {emu.timings['up_s']:.1f} s; run dir {emu.directory}")
        if emu.cluster:
            for i, part in enumerate(emu.cluster.parts):
                print(f"*** {emu.cluster.servers[i]}: planes {', '.join(map(str, part.planes))}, "
                      f"{len(part.hosts)} hosts" + (" (this CLI's)" if i == emu.cluster.here else ""))
        first = fabric.switches()[0]
        if emu.switch_netns(first):
            print(f"*** switch daemons {emu.switchd.mode}: e.g. sh ovs-ofctl -O OpenFlow15 dump-flows "
                  f"{emu.ofctl_target(first)}; sh tc -n {emu.switch_netns(first)} -s qdisc")
        CLI(emu.net)
    print(f"*** torn down in {emu.timings['down_s']:.1f} s")
    return 0


def cmd_controller(args: argparse.Namespace) -> int:
    """Becomes the controller process (the same one the emulator starts), after checking the model and app."""
    Fabric.load(args.fabric)
    module = app_module(args.app)
    argv = [sys.executable, "-m", "controllers.harness", "--app", module, "--fabric", str(args.fabric),
            "--host", args.listen, "--port", str(args.port), "--seed", str(args.seed)]
    if is_ryu_app(module):  # as the emulator's controller process runs one (emulator.net.controller)
        os.environ.setdefault("OSKEN_HUB_TYPE", "eventlet")
    sys.stdout.flush()
    os.execv(sys.executable, argv)


def cmd_alltoall(args: argparse.Namespace) -> int:
    fabric = fabric_from_args(args)
    outdir = outdir_from_args(args)
    report = alltoall.measure(fabric, outdir, app=args.app, seconds=args.seconds, seed=args.seed,
                          congestion=args.cc, intra_node=args.intra_node)
    print(alltoall.format_report(report))
    print(f"results in {outdir}/ (pairs.csv, summary.json)")
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    """Here, and on every other server given: `mpft clean` there, over ssh."""
    servers, ssh_config = servers_from_args(args)
    cleaned = runstate.clean_dead_runs()
    if not cleaned:
        print("nothing to clean")
    for run_id, counts in cleaned:
        print(runstate.describe_removed(run_id, counts))
    with tempfile.TemporaryDirectory(prefix="mpft-clean-") as sockets:
        for i, server in enumerate(s for s in servers or [] if not s.local):
            with Connection(server, Path(sockets) / f"ssh{i}", ssh_config=ssh_config) as conn:
                said = conn.run([conn.python, "-m", "emulator.cli", "clean"])
            print("".join(f"{server}: {line}\n" for line in said.splitlines()), end="")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("topo", help="build a fabric model and print its counts (nothing is started)")
    add_topo_options(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--save", type=Path, help="write the model JSON here")
    p.set_defaults(func=cmd_topo)

    p = sub.add_parser("doctor", help="what this machine's kernel and OVS offer, and what that enables")
    p.add_argument("--json", action="store_true")
    p.add_argument("--measure", action="store_true",
                   help="also measure the switch daemons' forwarding budget, per daemon and for the machine, and the "
                        "costs --link-mbps auto predicts with (two calibration runs, a few minutes; root)")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("up", help="bring a fabric up and open the Mininet CLI (EOF tears it down)")
    add_topo_options(p)
    p.add_argument("--app", default="ecmp",
                   help="controller app: ecmp, spray, adaptive, static, a path to an app .py, or none")
    p.add_argument("--pattern", type=Path, help="traffic pattern JSON for --app static")
    p.add_argument("--controller", metavar="tcp:HOST:PORT", help=CONTROLLER_HELP)
    p.add_argument("--seed", type=int, default=0)
    add_server_options(p, "spread the planes over these servers (the CLI reaches this machine's hosts)")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("controller", help="run a controller app alone, for a Mininet you start yourself")
    p.add_argument("--app", default="ecmp")
    p.add_argument("--fabric", "--model", dest="fabric", type=Path, required=True,
                   help="fabric JSON (mpft topo --save); --model is its old name")
    p.add_argument("--listen", default="127.0.0.1", help="OpenFlow listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=6653)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_controller)

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
    add_server_options(p, "also on these servers")
    p.set_defaults(func=cmd_clean)

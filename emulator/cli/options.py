"""What several commands take: the topology options, the transport options, seeds and the results directory."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from emulator.model import topologies
from emulator.model.capture import MIN_SNAPLEN, CaptureOptions
from emulator.model.errors import UserError
from emulator.model.fabric import Fabric
from emulator.model.schedule import Message
from emulator.model.servers import Server, parse_servers
from emulator.run import autorate
from traffic.options import TransportOptions


def rate_or_auto(text: str) -> float | str:
    """--link-mbps: Mbit/s, or `auto` (emulator.run.autorate chooses)."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected Mbit/s or auto, got {text!r}") from None


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
    ("link_mbps", rate_or_auto, "NIC and switch link rate in Mbit/s (default 10), or auto: the highest this "
                                "machine carries faithfully for the traffic, predicted before bring-up (mpft "
                                "traffic, mpft replay)"),
    ("nvlink_mbps", float, "NVLink rate in Mbit/s (default 4x the link rate)"),
    ("mtu", int, "MTU in bytes (default 9000)"),
    ("queue_kb", float, "egress queue limit in KiB (default 128)"),
    ("delay_ms", float, "one-way delay per link in ms (needs netem)"),
    ("loss_pct", float, "random loss per link in percent (needs netem)"),
    ("ecn", bool, "switches mark ECN (CE) as their queues grow: RED where the kernel has it, else an eBPF marker"),
    ("ecn_kmin_kb", float, "ECN marking starts at this backlog in KiB (default a quarter of the queue)"),
    ("ecn_kmax_kb", float, "ECN marking is certain from this backlog in KiB (default half the queue; equal to "
                           "--ecn-kmin-kb: DCTCP's step at K)"),
    ("ecn_pmax", float, "ECN marking probability just below --ecn-kmax-kb (default 1)"),
    ("lossless", bool, "lossless links: a switch port past its XOFF pauses the ports feeding it, which hold their "
                       "packets until XON, hop by hop to the hosts (PFC; per traffic class with "
                       "--queueing class, as PFC's priorities)"),
    ("pfc_reaction_us", float, "the reaction time a lossless port's headroom allows for, in us (default 2000)"),
    ("queueing", str, "switch egress queues: fifo (one shared), class (one per traffic class), voq (one per queue "
                      "pair) (default fifo)"),
]


def add_topo_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("topology (default: mpft, 2 planes, 16 nodes x 2 GPUs)")
    group.add_argument("--topo", default=topologies.DEFAULT_TOPO, choices=sorted(topologies.BUILDERS))
    group.add_argument("--fabric", "--model", dest="fabric", type=Path,
                       help="load a fabric JSON (mpft topo --save) instead of building one; --model is its old name")
    for name, kind, help_text in TOPO_OPTIONS:
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            group.add_argument(flag, action="store_true", default=None, help=help_text)
        else:
            group.add_argument(flag, type=kind, help=help_text)


def fabric_from_args(args: argparse.Namespace, mbps: float | None = None) -> Fabric:
    """The fabric the options describe; with --link-mbps auto, built at `mbps` (a command that runs traffic gives
    the lowest candidate rate until auto_rate has chosen; the others refuse auto)."""
    auto = getattr(args, "link_mbps", None) == "auto"
    if auto and mbps is None:
        raise UserError("auto chooses the rate for a schedule: mpft traffic and mpft replay take it",
                        field="--link-mbps")
    if args.fabric:
        if auto:
            raise UserError("auto builds the fabric at each rate it tries: give the topology options, not --fabric",
                            field="--link-mbps")
        return Fabric.load(args.fabric)
    params: dict[str, Any] = {name: getattr(args, name) for name, _, _ in TOPO_OPTIONS
                              if getattr(args, name) is not None}
    if auto:
        params["link_mbps"] = mbps
    return topologies.build(args.topo, **params)


def auto_rate(args: argparse.Namespace, fabric: Fabric, messages: list[Message], cc: str,
              regenerate: Callable[[Fabric], list[Message]] | None = None) -> tuple[Fabric, dict | None]:
    """With --link-mbps auto: the fabric at the rate autorate chooses, said in one line, and its prediction
    (for run_job); a schedule that fits at no rate is refused, naming the largest fabric with fewer nodes whose
    traffic (`regenerate`d on it) would fit. Otherwise the fabric as it is and None."""
    if getattr(args, "link_mbps", None) != "auto":
        return fabric, None
    costs = autorate.load_costs().with_free_cores()
    try:
        chosen = autorate.choose(lambda mbps: fabric_from_args(args, mbps), messages, cc, costs)
    except UserError as refused:
        nodes = fabric.params.get("nodes")
        smaller = None
        if regenerate is not None and nodes:
            def variant(n: int) -> tuple[Fabric, list[Message]]:
                f = fabric_from_args(argparse.Namespace(**{**vars(args), "nodes": n}), autorate.RATES[0])
                return f, regenerate(f)
            smaller = autorate.largest_fitting(variant, nodes, cc, costs)
        hint = (f"the largest that fits has --nodes {smaller.params['nodes']} ({len(smaller.gpu_hosts())} GPUs)"
                if smaller else "no fabric with fewer nodes fits either")
        raise UserError(f"{refused.args[0]}; {hint}", field="--link-mbps") from None
    print(f"--link-mbps auto: {chosen.mbps:g} Mbit/s, the highest that fits: predicted {chosen.cores:.2f} of "
          f"{chosen.of_cores()} ({chosen.share:.0%}; agents {chosen.agents:.2f}, switch daemons "
          f"{chosen.switches:.2f}; their pressure {chosen.pressure:.1f}) over the schedule's bound of "
          f"{chosen.seconds:.1f} s ({chosen.source} costs)")
    return fabric_from_args(args, chosen.mbps), autorate.as_record(chosen)


def outdir_from_args(args: argparse.Namespace) -> Path:
    """--out, or a new directory under results/ named by the time (noted in `args`: emulator.cli.main hands it to
    the user who ran sudo when the command ends, however it ends)."""
    args.results_dir = args.out or Path("results") / time.strftime("%Y%m%d-%H%M%S")
    return args.results_dir


def hand_to_sudo_user(path: Path) -> None:
    """Results written under sudo belong to the user who ran sudo (SUDO_UID and SUDO_GID), not to root: the
    directory, everything in it, and a default results/ above it."""
    uid, gid = os.environ.get("SUDO_UID", ""), os.environ.get("SUDO_GID", "")
    if os.geteuid() != 0 or not uid.isdigit() or not path.exists():
        return
    owner = (int(uid), int(gid) if gid.isdigit() else int(uid))
    tops = [path.parent] if path.parent.name == "results" and path.parent.stat().st_uid == 0 else []
    for p in [*tops, path, *path.rglob("*")]:
        os.chown(p, *owner, follow_symlinks=False)


def seed_list(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seeds like 1,2,3, got {text!r}") from None
    if not seeds or any(not 0 <= s < 2**32 for s in seeds):
        raise argparse.ArgumentTypeError("seeds are whole numbers from 0 to 2**32-1")
    return seeds


def app_env(args: argparse.Namespace) -> dict[str, str]:
    """Settings handed to the controller app (the static app's traffic pattern)."""
    if args.pattern is None:
        return {}
    if not args.pattern.is_file():
        raise UserError("no such pattern file", file=str(args.pattern), field="pattern")
    return {"MPFT_PATTERN": str(args.pattern.resolve())}


CONTROLLER_HELP = ("a controller of your own (Faucet, ONOS, a Ryu elsewhere) instead of --app; the switches run in the "
                   "machine's Open vSwitch and the run starts once every one has connected")


def add_server_options(p: argparse.ArgumentParser, what: str = "spread the planes over these servers") -> None:
    g = p.add_argument_group("several servers")
    g.add_argument("--servers", metavar="HOST,...",
                   help=f"{what}: [user@]host[:port], comma-separated, localhost among them (over ssh)")
    g.add_argument("--ssh-config", type=Path, metavar="FILE", help="an ssh configuration file for them (ssh -F)")


def servers_from_args(args: argparse.Namespace) -> tuple[list[Server] | None, Path | None]:
    """--servers and --ssh-config, checked before anything starts."""
    if args.ssh_config is not None and not args.ssh_config.is_file():
        raise UserError("no such ssh configuration file", file=str(args.ssh_config), field="--ssh-config")
    return (parse_servers(args.servers, "--servers") if args.servers else None), args.ssh_config


def add_capture_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("capture")
    g.add_argument("--capture", nargs="?", const="", default=None, metavar="PORTS",
                   help="write a pcap per interface into the run directory's pcap/: the hosts' NICs, or the "
                        "interfaces and nodes (all their ports) listed, comma-separated")
    g.add_argument("--capture-bytes", type=int, default=MIN_SNAPLEN,
                   help=f"bytes kept of each frame (default {MIN_SNAPLEN}: every header whole, no payload)")


def capture_from_args(args: argparse.Namespace) -> CaptureOptions | None:
    if args.capture is None:
        return None
    ports = tuple(p for p in args.capture.split(",") if p) or None
    return CaptureOptions(ports, args.capture_bytes).check()


def add_transport_options(p: argparse.ArgumentParser) -> None:
    """The transport options' table as flags, then routing, seed, timeout and results directory."""
    g = p.add_argument_group("transport and routing")
    g.add_argument("--app", default="ecmp", help="controller app: ecmp, spray, adaptive, static or a path")
    g.add_argument("--controller", metavar="tcp:HOST:PORT", help=CONTROLLER_HELP)
    for f in TransportOptions.user_fields():
        choices = f" ({', '.join(f.metadata['choices'])})" if f.metadata["choices"] else ""
        g.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                       help=f"{f.metadata['help']}{choices} (default {f.default})".replace("%", "%%"))
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--timeout", type=float, help="give up after this many seconds (default from the schedule)")
    g.add_argument("--out", type=Path, help="results directory (default results/<time>)")


def transport_from_args(args: argparse.Namespace) -> TransportOptions:
    return TransportOptions(**{f.name: getattr(args, f.name) for f in TransportOptions.user_fields()})


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

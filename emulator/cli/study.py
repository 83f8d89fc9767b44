"""`mpft run`: a study, every variant of a scenario per seed, with a report."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from emulator.cli.options import (
    CONTROLLER_HELP,
    add_capture_options,
    add_server_options,
    capture_from_args,
    outdir_from_args,
    seed_list,
    servers_from_args,
)
from emulator.model import capture
from emulator.model.servers import external_target
from emulator.study import report, scenario
from emulator.study.runner import run_study


def cmd_run(args: argparse.Namespace) -> int:
    loaded = scenario.load(args.study, quick=args.quick)
    tap = capture_from_args(args)
    if tap:  # a name no variant's fabric has is the command line's mistake, not the scenario file's
        for variant in loaded.variants:
            capture.interfaces(loaded.fabrics[variant.name], tap.ports)
        loaded = replace(loaded, capture=tap)
    if args.controller:
        external_target(args.controller)
        loaded = replace(loaded, controller=args.controller)
    servers, ssh_config = servers_from_args(args)
    if servers:  # the command line's servers, for a scenario written for one machine
        loaded = replace(loaded, servers=tuple(servers), ssh_config=ssh_config or loaded.ssh_config)
    seeds = [args.seed] if args.seed is not None else args.seeds
    outdir = outdir_from_args(args)
    metrics = run_study(loaded, outdir, seeds=seeds)
    print(report.format_table(metrics))
    print(f"report: {outdir / 'report.html'} (metrics.json, plots and one directory per run beside it)")
    return 0 if all(v.lost_messages == 0 for v in metrics.variants.values()) else 1


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a study: every variant of a scenario on the same traffic, with a report")
    p.add_argument("study", nargs="?", default="routing",
                   help="a built-in study (routing, ...) or a scenario TOML file (default: routing)")
    p.add_argument("--out", type=Path, help="results directory (default results/<time>)")
    p.add_argument("--seed", type=int, help="run this one seed")
    p.add_argument("--seeds", type=seed_list, help="run these seeds, e.g. 1,2,3 (default: the scenario's)")
    p.add_argument("--quick", action="store_true", help="the scenario's CI-sized version")
    p.add_argument("--controller", metavar="tcp:HOST:PORT", help=CONTROLLER_HELP)
    add_capture_options(p)
    add_server_options(p, "spread every run's planes over these servers (the scenario's servers, if any, "
                          "otherwise)")
    p.set_defaults(func=cmd_run)

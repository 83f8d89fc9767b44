"""The controller process: `python -m controllers.harness --app ecmp --model fabric.json` runs one os-ken app,
listening on 127.0.0.1 unless told otherwise. Apps are named (`ecmp` -> controllers/ecmp.py) or given as a
path. The emulator starts, waits on and stops it (emulator.net.controller)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from os_ken import cfg
from os_ken.base.app_manager import AppManager

from controllers import base
from emulator.model.fabric import Fabric


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controllers.harness", description=__doc__)
    parser.add_argument("--app", required=True, help="module name or .py path of the os-ken app")
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6653)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    Fabric.load(args.model)  # refuse a bad model before listening
    base.configure(base.Settings(model=args.model, ready_file=args.ready_file, seed=args.seed))
    cfg.CONF(args=["--ofp-listen-host", args.host, "--ofp-tcp-listen-port", str(args.port)], project="os_ken")
    logging.getLogger(__name__).info("os-ken %s on %s:%d, pid %d", args.app, args.host, args.port, os.getpid())
    AppManager.run_apps([args.app])
    return 0


if __name__ == "__main__":
    sys.exit(main())

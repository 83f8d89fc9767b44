"""The controller process: `python -m controllers.harness --app ecmp --fabric fabric.json` runs one os-ken app,
listening on 127.0.0.1 unless told otherwise. Apps are named (`ecmp` -> controllers/ecmp.py) or given as a
path; a Ryu app runs unchanged (controllers.ryu_compat). The emulator starts, waits on and stops it
(emulator.net.controller): a FabricApp says in the readiness file which switches hold its state; any other app
is marked `plain` there, and is ready once every switch has connected to it."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from os_ken import cfg
from os_ken.base.app_manager import AppManager
from os_ken.lib import hub

from controllers import base, ryu_compat
from emulator.model.fabric import Fabric


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controllers.harness", description=__doc__)
    parser.add_argument("--app", required=True, help="module name or .py path of the os-ken app")
    parser.add_argument("--fabric", "--model", dest="fabric", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6653)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    Fabric.load(args.fabric)  # refuse a bad fabric before listening
    base.configure(base.Settings(fabric_file=args.fabric, ready_file=args.ready_file, seed=args.seed))
    cfg.CONF(args=["--ofp-listen-host", args.host, "--ofp-tcp-listen-port", str(args.port)], project="os_ken")
    logging.getLogger(__name__).info("os-ken %s on %s:%d, pid %d", args.app, args.host, args.port, os.getpid())
    ryu_compat.install([Path(args.app).parent] if args.app.endswith(".py") else [])
    run([args.app], args.ready_file)
    return 0


def run(apps: list[str], ready_file: Path | None) -> None:
    """os-ken's AppManager.run_apps, with the readiness file told when no loaded app is a FabricApp."""
    manager = AppManager.get_instance()
    manager.load_apps(apps)
    if ready_file and not any(issubclass(cls, base.FabricApp) for cls in manager.applications_cls.values()):
        ready_file.write_text(json.dumps({"plain": True}))
    services = manager.instantiate_apps(**manager.create_contexts())
    try:
        hub.joinall(services)
    finally:
        manager.close()
        for service in services:
            service.kill()
        hub.joinall(services)


if __name__ == "__main__":
    sys.exit(main())

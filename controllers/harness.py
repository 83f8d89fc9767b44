"""Runs an os-ken app in its own process, listening on 127.0.0.1 only, and stops it by pid.

`python -m controllers.harness --app ecmp --model fabric.json` is the process; ControllerProcess starts,
waits on and stops it for the emulator. Apps are named (`ecmp` -> controllers/ecmp.py) or given as a path.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from emulator.model.errors import EnvironmentProblem, UserError

BUILTIN_APPS = ("ecmp", "spray", "static", "adaptive")


def app_module(app: str) -> str:
    """Module name or file path os-ken should load for `app`."""
    if app in BUILTIN_APPS:
        return f"controllers.{app}"
    path = Path(app)
    if path.suffix == ".py":
        if not path.is_file():
            raise UserError("no such controller app file", file=app, field="app")
        return str(path.resolve())
    raise UserError(f"unknown app {app!r} (built in: {', '.join(BUILTIN_APPS)}; or a path to a .py file)",
                    field="app")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ControllerProcess:
    """One controller process: start, wait until switches are synced, stop (TERM, then KILL)."""

    def __init__(self, app: str, model: Path, workdir: Path, seed: int = 0, host: str = "127.0.0.1",
                 port: int | None = None, env: dict[str, str] | None = None) -> None:
        self.module = app_module(app)
        self.env = {**os.environ, **(env or {})}  # app settings such as MPFT_PATTERN (controllers/static.py)
        self.model, self.seed, self.host = model, seed, host
        self.port = port or free_port(host)
        self.ready_file = workdir / "controller.ready"
        self.log_file = workdir / "controller.log"
        self.proc: subprocess.Popen | None = None

    @property
    def target(self) -> str:
        return f"tcp:{self.host}:{self.port}"

    def start(self) -> int:
        self.ready_file.write_text("")
        argv = [sys.executable, "-m", "controllers.harness", "--app", self.module, "--model", str(self.model),
                "--host", self.host, "--port", str(self.port), "--ready-file", str(self.ready_file),
                "--seed", str(self.seed)]
        with open(self.log_file, "ab") as log_out:
            self.proc = subprocess.Popen(argv, stdout=log_out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, cwd=Path(__file__).resolve().parent.parent,
                                         env=self.env)
        return self.proc.pid

    def synced(self) -> set[str]:
        return set(self.ready_file.read_text().split())

    def wait_synced(self, switches: list[str], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise EnvironmentProblem(f"controller exited ({self.proc.returncode}): {self.log_tail()}")
            if set(switches) <= self.synced():
                return
            time.sleep(0.05)
        missing = sorted(set(switches) - self.synced())
        raise EnvironmentProblem(f"controller did not sync {len(missing)} switches ({', '.join(missing[:4])}) "
                                 f"in {timeout:.0f} s: {self.log_tail()}")

    def log_tail(self, lines: int = 3) -> str:
        try:
            return " | ".join(self.log_file.read_text().strip().splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Under os-ken's native hub, threads are not daemons and hub.kill does nothing: end it by signal."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


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
    from controllers import base
    from emulator.model.fabric import Fabric

    Fabric.load(args.model)  # refuse a bad model before listening
    base.configure(base.Settings(model=args.model, ready_file=args.ready_file, seed=args.seed))
    from os_ken import cfg
    from os_ken.base.app_manager import AppManager

    cfg.CONF(args=["--ofp-listen-host", args.host, "--ofp-tcp-listen-port", str(args.port)], project="os_ken")
    logging.getLogger(__name__).info("os-ken %s on %s:%d, pid %d", args.app, args.host, args.port, os.getpid())
    AppManager.run_apps([args.app])
    return 0


if __name__ == "__main__":
    sys.exit(main())

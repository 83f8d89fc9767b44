"""The controller process seen from the emulator: start it, wait until it has synced every switch, stop it by
pid (the process itself is controllers.harness)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from controllers.apps import app_module, is_ryu_app
from emulator.model.errors import EnvironmentProblem
from emulator.net.commands import netns_path
from emulator.net.priority import NETWORK_NICE, set_group_nice
from traffic.netns import entered

REPO = Path(__file__).resolve().parents[2]
OPENFLOW_PORT = 6653
TCP_ESTABLISHED = "01"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def connections(port: int, netns: str | None, local: bool, host: str | None = None) -> int:
    """Established TCP connections on `port` in a namespace: ours (local=True), or to `host`'s (IPv4 only)."""
    want = socket.inet_aton(socket.gethostbyname(host))[::-1].hex().upper() if host else None
    count = 0
    with entered(netns):
        for table in ("tcp", "tcp6"):
            try:
                rows = Path(f"/proc/thread-self/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                fields = row.split()
                address, _, end_port = (fields[1] if local else fields[2]).rpartition(":")
                if fields[3] == TCP_ESTABLISHED and int(end_port, 16) == port and want in (None, address):
                    count += 1
    return count


def wait_connected(switches: int, port: int, netns: str | None, timeout: float, local: bool,
                   host: str | None = None) -> None:
    """Until `switches` OpenFlow connections on `port` are up: any app's readiness, and an external one's."""
    deadline = time.monotonic() + timeout
    while (seen := connections(port, netns, local, host)) < switches:
        if time.monotonic() > deadline:
            raise EnvironmentProblem(f"only {seen} of {switches} switches connected to the controller on port "
                                     f"{port} in {timeout:.0f} s")
        time.sleep(0.05)


class ControllerProcess:
    """One controller process: start, wait until switches are synced, stop (TERM, then KILL)."""

    def __init__(self, app: str, fabric_file: Path, workdir: Path, seed: int = 0, host: str = "127.0.0.1",
                 port: int | None = None, env: dict[str, str] | None = None, netns: str | None = None) -> None:
        self.module = app_module(app)
        self.env = {**os.environ, **(env or {})}  # app settings such as MPFT_PATTERN (controllers/static.py)
        if is_ryu_app(self.module):
            self.env.setdefault("OSKEN_HUB_TYPE", "eventlet")
        self.fabric_file, self.seed, self.host, self.netns = fabric_file, seed, host, netns
        # A namespace of the run's own has no other listeners: OpenFlow's own port is free there.
        self.port = port or (OPENFLOW_PORT if netns else free_port(host))
        self.ready_file = workdir / "controller.ready"
        self.log_file = workdir / "controller.log"
        self.proc: subprocess.Popen | None = None

    @property
    def target(self) -> str:
        return f"tcp:{self.host}:{self.port}"

    def start(self) -> int:
        self.ready_file.write_text("")
        inside = ["ip", "netns", "exec", self.netns] if self.netns else []  # both exec: the pid stays the app's
        argv = [*inside, "nice", "-n", str(NETWORK_NICE), sys.executable, "-m", "controllers.harness",
                "--app", self.module, "--fabric", str(self.fabric_file),
                "--host", self.host, "--port", str(self.port), "--ready-file", str(self.ready_file),
                "--seed", str(self.seed)]
        with open(self.log_file, "ab") as log_out:
            self.proc = subprocess.Popen(argv, stdout=log_out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, cwd=REPO,
                                         env=self.env)
        set_group_nice(self.proc.pid, NETWORK_NICE)
        return self.proc.pid

    def readiness(self) -> tuple[set[str], set[frozenset[str]]]:
        """What the app last wrote (controllers/base.py): the synced switches and the links it believes down."""
        text = self.ready_file.read_text()
        state = json.loads(text) if text else {}
        return set(state.get("synced", ())), {frozenset(link) for link in state.get("links_down", ())}

    @property
    def plain(self) -> bool:
        """The app is not a FabricApp (controllers.harness says so): it is ready once every switch connected."""
        text = self.ready_file.read_text()
        return bool(text) and json.loads(text).get("plain", False)

    def wait_synced(self, switches: list[str], links_down: set[frozenset[str]] = frozenset(),
                    timeout: float = 60.0) -> None:
        """Until every switch holds the app's state and the app believes exactly `links_down` down: a port that
        came up after its switch connected is a repair in flight, and traffic sent now could meet it."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise EnvironmentProblem(f"controller exited ({self.proc.returncode}): {self.log_tail()}")
            if self.plain:
                wait_connected(len(switches), self.port, netns_path(self.netns), deadline - time.monotonic(),
                               local=True)
                return
            synced, down = self.readiness()
            if set(switches) <= synced and down == links_down:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        missing = sorted(set(switches) - synced)
        if missing:
            raise EnvironmentProblem(f"controller did not sync {len(missing)} switches ({', '.join(missing[:4])}) "
                                     f"in {timeout:.0f} s: {self.log_tail()}")
        wrong = sorted("-".join(sorted(link)) for link in down ^ links_down)
        raise EnvironmentProblem(f"controller's view of {len(wrong)} links ({', '.join(wrong[:4])}) is not the "
                                 f"fabric's after {timeout:.0f} s: {self.log_tail()}")

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

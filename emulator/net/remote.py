"""Commands on another server, over one ssh connection per server (a ControlMaster that every command shares,
as Mininet's cluster mode does), each an argument list: ssh runs a fixed command line there
(emulator.net.remote_exec) and the argument list travels as JSON on standard input, never through a shell.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from emulator.model.errors import EnvironmentProblem
from emulator.model.servers import ClockOffset, ClockSample, Server, estimate_offset

CONNECT_TIMEOUT_S = 15.0
CLOCK_SAMPLES = 32


class Connection:
    """One server's ssh connection. `python` is the interpreter there that has mpft-emu installed (by default
    this one's path: the same checkout on every server); `ssh_config` an ssh configuration file (`ssh -F`) for
    keys and host names, else the user's own."""

    def __init__(self, server: Server, socket: Path, python: str = sys.executable, ssh_config: Path | None = None):
        self.server, self.socket, self.python, self.ssh_config = server, socket, python, ssh_config
        self.master: subprocess.Popen | None = None

    def _ssh(self, *options: str) -> list[str]:
        config = ["-F", str(self.ssh_config)] if self.ssh_config else []
        return ["ssh", *config, "-S", str(self.socket), "-p", str(self.server.port), "-o", "BatchMode=yes", *options]

    def open(self) -> int:
        """Connect (the master's pid, for the run's records), or an EnvironmentProblem with ssh's words."""
        self.master = subprocess.Popen(
            self._ssh("-M", "-N", "-o", "ControlPersist=no", "-o", "ServerAliveInterval=5",
                      "-o", f"ConnectTimeout={int(CONNECT_TIMEOUT_S)}", "--", self.server.target),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S + 5
        while time.monotonic() < deadline:
            if self.master.poll() is not None:
                said = self.master.stderr.read().strip().splitlines()
                raise EnvironmentProblem(f"ssh to {self.server} failed: {said[-1] if said else 'no reason given'}")
            check = subprocess.run(self._ssh("-O", "check", "--", self.server.target), capture_output=True,
                                   check=False)
            if check.returncode == 0:
                return self.master.pid
            time.sleep(0.05)
        self.close()
        raise EnvironmentProblem(f"ssh to {self.server}: no connection after {CONNECT_TIMEOUT_S:.0f} s")

    def close(self) -> None:
        if self.master is None:
            return
        subprocess.run(self._ssh("-O", "exit", "--", self.server.target), capture_output=True, check=False)
        try:
            self.master.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.master.kill()
            self.master.wait()
        self.master.stderr.close()
        self.master = None

    def __enter__(self) -> Connection:
        self.open()
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def forward_here(self, host: str, port: int) -> int:
        """A port on the server's loopback that reaches `host`:`port` as this machine reaches it (our own
        loopback's, or a controller elsewhere), through this connection (its number)."""
        done = subprocess.run(self._ssh("-O", "forward", "-R", f"127.0.0.1:0:{host}:{port}", "--",
                                        self.server.target), capture_output=True, text=True, check=False)
        if done.returncode != 0 or not done.stdout.strip().isdigit():
            raise EnvironmentProblem(f"{self.server}: forwarding to {host}:{port} failed: "
                                     f"{done.stderr.strip()[:300]}")
        return int(done.stdout)

    def addresses(self) -> tuple[str, str]:
        """(ours, the server's): the addresses this connection runs between, as the server sees them."""
        ours, _, theirs, _ = self.run(["printenv", "SSH_CONNECTION"]).split()
        return ours, theirs

    def _remote(self) -> list[str]:
        """The ssh command line running remote_exec there (ssh joins a remote command into one string for the
        server's shell: our interpreter's path, quoted, is the only word in it)."""
        return self._ssh("--", self.server.target, shlex.join([self.python, "-m", "emulator.net.remote_exec"]))

    def run_bytes(self, argv: list[str], input_bytes: bytes = b"", timeout: float = 120.0) -> bytes:
        """Run `argv` there to completion: its output, or an EnvironmentProblem naming the server."""
        done = subprocess.run(self._remote(), input=json.dumps({"argv": argv}).encode() + b"\n" + input_bytes,
                              capture_output=True, check=False, timeout=timeout)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).decode(errors="replace").strip()[:300]
            raise EnvironmentProblem(f"{self.server}: {argv[0]} failed (exit {done.returncode}): {said}")
        return done.stdout

    def run(self, argv: list[str], input_text: str = "", timeout: float = 120.0) -> str:
        """As run_bytes, in text."""
        return self.run_bytes(argv, input_text.encode(), timeout).decode()

    def read_file(self, path: str, timeout: float = 600.0) -> bytes:
        """A file's bytes from there (a pcap: binary)."""
        return self.run_bytes(["cat", "--", path], timeout=timeout)

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start `argv` there; its standard input is the returned process's, after our header."""
        proc = subprocess.Popen(self._remote(), stdin=subprocess.PIPE, **kwargs)
        header = json.dumps({"argv": argv}) + "\n"
        proc.stdin.write(header if kwargs.get("text") else header.encode())
        proc.stdin.flush()
        return proc

    def clock_offset(self, samples: int = CLOCK_SAMPLES) -> ClockOffset:
        """How far the server's CLOCK_MONOTONIC is from ours, from the fastest of `samples` exchanges, and its
        CLOCK_REALTIME: the monotonic offset, plus how much further ahead its realtime is of its monotonic than
        ours is (NTP keeps real servers' realtimes close; a time namespace shifts monotonic alone)."""
        proc = subprocess.Popen(self._remote(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        taken, ahead = [], []
        try:
            proc.stdin.write(json.dumps({"clock": True}).encode() + b"\n")
            for _ in range(samples):
                sent = time.monotonic_ns()
                proc.stdin.write(b"?")
                proc.stdin.flush()
                line = proc.stdout.readline()
                received = time.monotonic_ns()
                if not line:
                    raise EnvironmentProblem(f"{self.server}: its clock did not answer: "
                                             f"{proc.stderr.read().decode(errors='replace').strip()[:300]}")
                remote, realtime_ahead = map(int, line.split())
                taken.append(ClockSample(sent, remote, received))
                ahead.append(realtime_ahead)
        finally:
            proc.stdin.close()
            proc.wait(timeout=10)
            proc.stdout.close()
            proc.stderr.close()
        ours = time.time_ns() - time.monotonic_ns()
        offset = estimate_offset(taken)
        return dataclasses.replace(offset, realtime_ns=offset.offset_ns + int(statistics.median(ahead)) - ours)

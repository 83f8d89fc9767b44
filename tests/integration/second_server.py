"""A second "server" on this machine, for the several-servers tests: its own network namespace (reached over a
veth at 198.18.250.2, the benchmarking range), its own mount namespace (a private /run, so its own
/run/openvswitch and /run/mpft-emu, and private OVS configuration and logs), its own process namespace (its
`mpft clean` must not see this machine's processes), its own time namespace (its
CLOCK_MONOTONIC offset by a known amount, as a real server's clock is), and its own sshd listening only on its
address, with keys made for the test. Everything is removed on exit, and the test checks that.

`python -m tests.integration.second_server boot DIR` is the server's first process, run inside its namespaces:
it makes the private mounts, starts the server's own Open vSwitch and becomes sshd. Mininet's `mn` there is a
recorder that runs nothing (Mininet's clean-up mode must never run on a server: it sweeps the whole machine), and
SecondServer.mn_calls() says whether anything called it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from emulator.model.servers import Server, parse_server
from emulator.net.runstate import netns_inode, terminate
from tests.integration.helpers import REPO

NETNS = "mpfttest-srv2"
ADDRESS, PEER = "198.18.250.2", "198.18.250.1"
LINK, LINK_PEER = "mpfttest-s1", "mpfttest-s2"
MTU = 9100  # the fabric's 9000-byte frames and VXLAN's 50 bytes
SSHD = "/usr/sbin/sshd"
MN = "/usr/bin/mn"
OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
PRIVATE = ("/run", "/etc/openvswitch", "/var/lib/openvswitch", "/var/log/openvswitch")
SSHD_CONFIG = """ListenAddress {address}
HostKey {dir}/host_key
AuthorizedKeysFile {dir}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
"""
CLIENT_CONFIG = """Host {address}
  User root
  IdentityFile {dir}/client_key
  IdentitiesOnly yes
  UserKnownHostsFile {dir}/known_hosts
  StrictHostKeyChecking yes
"""


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def write_recorder(path: Path, log: Path) -> Path:
    """An executable at `path` that appends how it was called to `log` and does nothing else."""
    path.write_text(f'#!/bin/sh\necho "$0 $*" >> "{log}"\n')
    path.chmod(0o755)
    return path


class SecondServer:
    """`with SecondServer(clock_offset_s=...) as srv:` srv.server and srv.ssh_config reach it."""

    def __init__(self, clock_offset_s: int = 0) -> None:
        self.clock_offset_s = clock_offset_s
        self.server: Server = parse_server(ADDRESS)
        self._tmp = tempfile.TemporaryDirectory(prefix="mpfttest-srv2-")
        self.dir = Path(self._tmp.name)
        self.ssh_config = self.dir / "ssh_config"
        self.boot: subprocess.Popen | None = None
        self._log = None

    def __enter__(self) -> SecondServer:
        if not Path(SSHD).exists():
            raise RuntimeError(f"{SSHD} is missing: `sudo make setup` installs openssh-server")
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        d = self.dir
        for key in ("host_key", "client_key"):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key))
        (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
        (d / "known_hosts").write_text(f"{ADDRESS} {(d / 'host_key.pub').read_text()}")
        (d / "sshd_config").write_text(SSHD_CONFIG.format(address=ADDRESS, dir=d))
        self.ssh_config.write_text(CLIENT_CONFIG.format(address=ADDRESS, dir=d))
        _run("ip", "netns", "add", NETNS)
        _run("ip", "link", "add", LINK, "type", "veth", "peer", "name", LINK_PEER, "netns", NETNS)
        _run("ip", "link", "set", LINK, "mtu", str(MTU))
        _run("ip", "-n", NETNS, "link", "set", LINK_PEER, "mtu", str(MTU))
        _run("ip", "addr", "add", f"{PEER}/30", "dev", LINK)
        _run("ip", "link", "set", LINK, "up")
        _run("ip", "-n", NETNS, "addr", "add", f"{ADDRESS}/30", "dev", LINK_PEER)
        _run("ip", "-n", NETNS, "link", "set", LINK_PEER, "up")
        _run("ip", "-n", NETNS, "link", "set", "lo", "up")
        offset = str(self.clock_offset_s)
        self._log = (d / "sshd.log").open("w")
        self.boot = subprocess.Popen(
            ["ip", "netns", "exec", NETNS, "unshare", "--mount", "--propagation", "private", "--pid", "--mount-proc",
             "--time", "--monotonic", offset, "--boottime", offset, "--fork",
             sys.executable, "-m", "tests.integration.second_server", "boot", str(d)],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log)
        self._wait_listening()

    def _wait_listening(self) -> None:
        for _ in range(200):
            if self.boot.poll() is not None:
                raise RuntimeError(f"the second server's sshd ended: {(self.dir / 'sshd.log').read_text()[-500:]}")
            ss = subprocess.run(["ip", "netns", "exec", NETNS, "ss", "-Hltn", f"src {ADDRESS}:22"],
                                capture_output=True, text=True)
            if ss.stdout.strip():
                return
            time.sleep(0.05)
        raise RuntimeError("the second server's sshd did not listen within 10 s")

    def mn_calls(self) -> list[str]:
        """How the server's `mn` was called, if it ever was."""
        log = self.dir / "mn-calls"
        return log.read_text().splitlines() if log.exists() else []

    def processes(self) -> list[int]:
        """Every process inside the server's network namespace."""
        try:
            inode = os.stat(f"/run/netns/{NETNS}").st_ino
        except OSError:
            return []
        return [int(p.name) for p in Path("/proc").iterdir()
                if p.name.isdigit() and netns_inode(int(p.name)) == inode]

    def __exit__(self, *_exc) -> None:
        terminate(set(self.processes()))
        if self.boot is not None:
            self.boot.wait(timeout=10)
        if self._log is not None:
            self._log.close()
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)  # its end of the veth goes with it
        subprocess.run(["ip", "link", "del", LINK], capture_output=True)
        self._tmp.cleanup()


def boot(directory: str) -> None:
    """Inside the server's namespaces: private mounts, then sshd in the foreground."""
    for path in PRIVATE:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "mpfttest-srv2", path], check=True)
    for sub in ("sshd", "openvswitch", "mpft-emu", "netns"):
        Path("/run", sub).mkdir()
    if Path(MN).exists():
        recorder = write_recorder(Path(directory) / "mn", Path(directory) / "mn-calls")
        subprocess.run(["mount", "--bind", str(recorder), MN], check=True)
    # The server's own Open vSwitch, as a real server has one running (its switches are built there).
    subprocess.run([OVS_CTL, "start", "--system-id=random"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    os.execv(SSHD, [SSHD, "-D", "-e", "-f", f"{directory}/sshd_config"])


if __name__ == "__main__" and sys.argv[1:2] == ["boot"]:
    boot(sys.argv[2])

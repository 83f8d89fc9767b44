"""Open vSwitch configuration in one ovsdb transaction for all bridges, instead of one round trip per bridge.

Every bridge we make carries `external_ids:mpft-emu-run=<run id>`, so leftovers of a crashed run can be
found and removed without touching anyone else's bridges.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from emulator.model.errors import EnvironmentProblem

RUN_KEY = "mpft-emu-run"
PROTOCOLS = "OpenFlow13,OpenFlow15"


@dataclass(frozen=True)
class BridgeSpec:
    name: str
    dpid: int
    ports: tuple[tuple[str, int], ...]  # (interface, OpenFlow port number)


def add_bridges_args(bridges: list[BridgeSpec], run_id: str, datapath_type: str,
                     controller: str | None) -> list[str]:
    """ovs-vsctl arguments creating every bridge with its ports, in fail-mode secure.

    Plain `add-br` (not --may-exist) makes the whole transaction fail if any name is taken, so a foreign or
    leftover bridge is never adopted and nothing is half-created.
    """
    args: list[str] = []
    for i, br in enumerate(bridges):
        args += ["--", "add-br", br.name,
                 "--", "set", "bridge", br.name, f"datapath_type={datapath_type}", "fail_mode=secure",
                 f"protocols={PROTOCOLS}", f"other-config:datapath-id={br.dpid:016x}",
                 "other-config:disable-in-band=true", f"external_ids:{RUN_KEY}={run_id}"]
        for intf, ofport in br.ports:
            args += ["--", "add-port", br.name, intf, "--", "set", "interface", intf,
                     f"ofport_request={ofport}"]
        if controller:
            # A short reconnect backoff, so switches find a restarted controller quickly.
            args += ["--", f"--id=@c{i}", "create", "controller", f'target="{controller}"', "max_backoff=1000",
                     "--", "set", "bridge", br.name, f"controller=@c{i}"]
    return args


def del_bridges_args(names: list[str]) -> list[str]:
    args: list[str] = []
    for name in names:
        args += ["--", "--if-exists", "del-br", name]
    return args


def vsctl(args: list[str], timeout: int = 120, db: str | None = None) -> str:
    """Run one ovs-vsctl transaction and wait until ovs-vswitchd has applied it; a failure is reported with
    OVS's own message. `db` is a private instance's database socket (None: the machine's own OVS)."""
    if not args:
        return ""
    where = [f"--db=unix:{db}"] if db else []
    run = subprocess.run(["ovs-vsctl", *where, f"--timeout={timeout}", *args], capture_output=True, text=True,
                         check=False)
    if run.returncode != 0:
        raise EnvironmentProblem(f"ovs-vsctl failed: {run.stderr.strip().splitlines()[-1:] or run.returncode}")
    return run.stdout


def bridges_of_run(run_id: str | None = None) -> dict[str, str]:
    """Our bridges (name -> run id), of one run or of every run."""
    out = vsctl(["--format=csv", "--data=bare", "--no-headings", "--columns=name,external_ids",
                 "list", "bridge"])
    found = {}
    for line in out.splitlines():
        name, _, ids = line.partition(",")
        for item in ids.strip('"').split():
            key, _, value = item.partition("=")
            if key == RUN_KEY and (run_id is None or value == run_id):
                found[name] = value
    return found



SO_SNDBUFFORCE = 32
SEND_BUFFER = 16 * 1024 * 1024


SYSTEM_PIDFILE = Path("/var/run/openvswitch/ovs-vswitchd.pid")


def read_pid(pidfile: Path = SYSTEM_PIDFILE) -> int | None:
    """The pid an OVS daemon wrote (the machine's own ovs-vswitchd by default), or None."""
    try:
        return int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None


def set_send_buffer(size: int | None = SEND_BUFFER, pid: int | None = None) -> int | None:
    """Set the send buffer of ovs-vswitchd's shared AF_PACKET transmit socket; returns the previous size.

    vswitchd transmits on every userspace port through one unbound AF_PACKET socket, and every packet waiting
    in an egress qdisc is charged to it. At the machine default (212,992 bytes) a few backlogged queues exhaust
    it and vswitchd drops packets on any port (EAGAIN), outside the modelled queues: measured, a spine forwarded
    504 of 550 packets with no qdisc drop; with 16 MiB it forwarded all 617 of 617. The socket is reached with
    pidfd_getfd (root); `size=None` only reads it. `pid` is a private ovs-vswitchd (default: the machine's
    own); its sockets are listed in its own network namespace. Returns None where it cannot be found.
    """
    pid = pid or read_pid()
    if pid is None or not hasattr(os, "pidfd_open"):
        return None
    unbound = set()
    for line in Path(f"/proc/{pid}/net/packet").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) > 8 and fields[4] == "0":  # Iface 0: not bound to a port
            unbound.add(fields[8])
    libc = ctypes.CDLL(None, use_errno=True)
    previous = None
    pidfd = os.pidfd_open(pid)
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if not (target.startswith("socket:[") and target[8:-1] in unbound):
                continue
            dup = libc.syscall(438, pidfd, int(fd), 0)  # pidfd_getfd
            if dup < 0:
                continue
            sock = socket.socket(fileno=dup)
            try:
                previous = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
                if size is not None:
                    sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, size // 2)  # the kernel doubles it
            finally:
                sock.close()
    finally:
        os.close(pidfd)
    return previous

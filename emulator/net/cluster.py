"""A cluster run (a fabric's planes over several servers), seen from the machine that runs the controller.

Each server builds its own part of the fabric (emulator.model.placement: whole planes) with our own bring-up,
in a process of its own there (emulator.run.part) started over its ssh connection (emulator.net.remote). Its
switches reach the one controller (our app, or the user's) through a port on its loopback that ssh forwards
here; its switches' queues stream back for the controller's queue file; the halves of an NVLink domain are
joined by VXLAN between the servers' addresses. Closing a part's standard input (or losing
its connection) tears that part down.
"""

from __future__ import annotations

import json
import logging
import select
import subprocess
import threading
import time
from dataclasses import asdict
from pathlib import Path

from emulator.model.errors import EnvironmentProblem, ToolFailed, UserError
from emulator.model.fabric import Fabric
from emulator.model.placement import TunnelEnd, partition, place_planes, subfabric, tunnel_ends, tunnels
from emulator.model.servers import ClockDrift, ClockOffset, Server, drift
from emulator.net.capture import shift_pcap
from emulator.net.commands import run_tool
from emulator.net.remote import Connection
from emulator.net.runstate import RunState

log = logging.getLogger(__name__)

PART_UP_TIMEOUT_S = 300.0
PART_DOWN_TIMEOUT_S = 120.0
VXLAN_OVERHEAD = 50  # outer Ethernet, IPv4, UDP and VXLAN headers
PART_PROGRAM = "emulator.run.part"  # run there by name: it runs agents too, a layer above this one


class QueueFeed:
    """Another server's switch queues as its emulator.net.queue_feed streams them: `latest` is the last line."""

    def __init__(self, server: Server, proc: subprocess.Popen) -> None:
        self.server, self.proc = server, proc
        self.latest: dict[str, dict[str, int]] = {}
        self._thread = threading.Thread(target=self._read, name=f"queues {server}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.latest = json.loads(line)

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._thread.join(timeout=10)
        self.proc.stdout.close()


def _route_mtu(route_json: str, mtu_of) -> int:
    """The MTU of the device `ip -j route get` chose (a route's own mtu, if it has one, wins)."""
    route = json.loads(route_json)[0]
    metrics = {k: v for m in route.get("metrics", []) for k, v in m.items()}
    return int(metrics.get("mtu") or mtu_of(route["dev"]))


def local_path_mtu(address: str) -> int:
    """The MTU towards a server the user named: no route there is the machine's network, not our command."""
    try:
        route = run_tool(["ip", "-j", "route", "get", address])
    except ToolFailed as exc:
        raise EnvironmentProblem(f"{address}: no route from here ({exc.stderr.strip()[:200]})") from None
    return _route_mtu(route, lambda dev: Path(f"/sys/class/net/{dev}/mtu").read_text())


def remote_path_mtu(conn: Connection, address: str) -> int:
    return _route_mtu(conn.run(["ip", "-j", "route", "get", address]),
                      lambda dev: conn.run(["cat", f"/sys/class/net/{dev}/mtu"]))


class RemotePart:
    """The process building and holding one server's part; host commands go to it as JSON lines."""

    def __init__(self, server: Server, proc: subprocess.Popen, log_file: Path) -> None:
        self.server, self.proc, self.log_file = server, proc, log_file
        self.up: dict = {}

    def _reply(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            said = self.log_file.read_text().strip().splitlines()[-3:] if self.log_file.exists() else []
            raise EnvironmentProblem(f"{self.server}: its part of the fabric did not answer"
                                     + (f": {' / '.join(said)}" if said else ""))
        reply = json.loads(line)
        if "error" in reply:
            raise EnvironmentProblem(f"{self.server}: {reply['error']}")
        return reply

    def wait_up(self, timeout: float = PART_UP_TIMEOUT_S) -> dict:
        """What the part said once up: its run's id there and its bring-up times."""
        self.up = self._reply(timeout)["up"]
        return self.up

    def request(self, message: dict, timeout: float = 600.0) -> str:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        return self._reply(timeout)["out"]

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=PART_DOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("%s: its part did not come down in %.0f s; closing the connection", self.server,
                        PART_DOWN_TIMEOUT_S)
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


class RemoteHost:
    """A host on another server, as far as commands go (Mininet's `cmd`, `sendCmd` and `waitOutput`: several
    hosts can run a command at once)."""

    def __init__(self, name: str, part: RemotePart) -> None:
        self.name, self.part = name, part

    def sendCmd(self, *args, **_kwargs) -> None:  # noqa: N802 - Mininet's name
        self.part.request({"host": self.name, "send": " ".join(str(a) for a in args)})

    def waitOutput(self, **_kwargs) -> str:  # noqa: N802 - Mininet's name
        return self.part.request({"host": self.name, "wait": True})

    def cmd(self, *args, **kwargs) -> str:
        self.sendCmd(*args)
        return self.waitOutput()


class Cluster:
    """The servers of a run: placement, connections, clock offsets and the remote parts."""

    def __init__(self, fabric: Fabric, servers: list[Server], ssh_config: Path | None = None) -> None:
        here = [i for i, s in enumerate(servers) if s.local]
        if not here:
            raise UserError("list localhost among the servers: this machine runs the controller and its planes",
                            field="servers")
        self.fabric, self.servers, self.ssh_config, self.here = fabric, servers, ssh_config, here[0]
        self.placement = place_planes(fabric, len(servers))
        self.parts = partition(fabric, self.placement)
        self.tunnels = tunnels(fabric, self.placement)
        self.connections: dict[int, Connection] = {}
        self.addresses: dict[int, str] = {}
        self.clock_offsets: dict[int, ClockOffset] = {}
        self.remote_parts: dict[int, RemotePart] = {}
        self.queue_feeds: list[QueueFeed] = []
        self.capturing: list[int] = []  # the servers capturing now
        self._server_of = {node: i for i, part in enumerate(self.parts) for node in part.hosts + part.switches}

    def remote(self) -> list[int]:
        return [i for i in range(len(self.servers)) if i != self.here]

    def server_of(self, node: str) -> int:
        """The server of a host or a switch (an NVLink domain has a half on several)."""
        return self._server_of[node]

    def clock(self, i: int) -> ClockOffset:
        """Server i's clock offset from ours (none for this machine's own)."""
        return self.clock_offsets.get(i, ClockOffset(offset_ns=0, round_trip_ns=0))

    def clock_drifts(self) -> dict[str, ClockDrift]:
        """Each other server's clock estimated again: how far it moved against ours since connect."""
        return {str(self.servers[i]): drift(self.clock_offsets[i], conn.clock_offset())
                for i, conn in self.connections.items()}

    def connect(self, state: RunState) -> None:
        """One ssh connection per server (recorded, so teardown and `mpft clean` find it), its address and its
        clock's offset from ours."""
        for i in self.remote():
            conn = Connection(self.servers[i], state.directory / f"ssh{i}", ssh_config=self.ssh_config)
            state.add_process(f"ssh {self.servers[i]}", conn.open())
            state.save()
            self.connections[i] = conn
            ours, self.addresses[i] = conn.addresses()
            self.addresses.setdefault(self.here, ours)
            self._check_path_mtu(i, local_path_mtu(self.addresses[i]), "from here")
            self._check_path_mtu(i, remote_path_mtu(conn, ours), "from there")
            self.clock_offsets[i] = conn.clock_offset()

    def _check_path_mtu(self, i: int, mtu: int, direction: str) -> None:
        """A fabric frame must cross between servers whole: our agents' frames are not fragmented."""
        need = self.fabric.mtu + VXLAN_OVERHEAD
        if mtu < need:
            raise EnvironmentProblem(
                f"{self.servers[i]}: the network {direction} carries {mtu}-byte packets, and the fabric's "
                f"{self.fabric.mtu}-byte frames need {need} inside VXLAN: raise the servers' MTU, or build the "
                f"fabric with --mtu {mtu - VXLAN_OVERHEAD}")

    def local_part(self) -> tuple[Fabric, tuple[TunnelEnd, ...]]:
        """What this machine builds, and its tunnel ends."""
        return (subfabric(self.fabric, self.parts[self.here].nodes),
                tuple(tunnel_ends(self.tunnels, self.here, self.addresses)))

    def start_parts(self, state: RunState, controller: tuple[str, int], shape: bool) -> None:
        """Every remote part starts building at once (wait_parts waits for them); its switches reach
        `controller` (host, port, as this machine reaches it) through its connection."""
        for i, conn in self.connections.items():
            part = self.parts[i]
            header = {"model": self.fabric.to_dict(), "nodes": part.nodes,
                      "tunnels": [asdict(t) for t in tunnel_ends(self.tunnels, i, self.addresses)],
                      "controller": f"tcp:127.0.0.1:{conn.forward_here(*controller)}", "shape": shape}
            log_file = state.directory / f"part{i}.log"
            with log_file.open("w") as err:
                proc = conn.popen([conn.python, "-m", PART_PROGRAM], stdout=subprocess.PIPE, stderr=err,
                                  text=True)
            state.add_process(f"part {self.servers[i]}", proc.pid)
            state.save()
            proc.stdin.write(json.dumps(header) + "\n")
            proc.stdin.flush()
            self.remote_parts[i] = RemotePart(self.servers[i], proc, log_file)

    def wait_parts(self) -> dict[str, float]:
        """Until every remote part is up: each one's bring-up time, s."""
        t0, took = time.monotonic(), {}
        for part in self.remote_parts.values():
            up = part.wait_up(max(1.0, PART_UP_TIMEOUT_S - (time.monotonic() - t0)))
            took[str(part.server)] = up["up_s"]
        return took

    def start_queue_feeds(self, state: RunState) -> None:
        """Each other server streams its switches' queues, for the controller's queue file (QueueExporter)."""
        for i, conn in self.connections.items():
            proc = conn.popen([conn.python, "-m", "emulator.net.queue_feed", "--switches",
                               ",".join(self.parts[i].switches)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
            state.add_process(f"queues {self.servers[i]}", proc.pid)
            state.save()
            self.queue_feeds.append(QueueFeed(self.servers[i], proc))

    def queues(self) -> dict[str, dict[str, int]]:
        """The other servers' switch queues, as last streamed."""
        return {switch: ports for feed in self.queue_feeds for switch, ports in feed.latest.items()}

    def server_of_interface(self, node: str, peer: str) -> int:
        """Where a port is: its node's server; an NVLink domain's port, on its GPU's (each holds a half)."""
        return self.server_of(peer if self.fabric.node(node)["kind"] == "nvlink" else node)

    def start_captures(self, wanted: dict[int, list[str]], snaplen: int) -> None:
        """Each server's part captures the interfaces wanted there, into its own run directory, once each is
        listening."""
        for i, intfs in wanted.items():
            self.remote_parts[i].request({"capture": {"interfaces": intfs, "snaplen": snaplen}})
            self.capturing.append(i)

    def stop_captures(self, directory: Path) -> dict[str, dict]:
        """Each part's captures stopped, their files copied into `directory` with their frames' time stamps on
        our clock: interface -> file and counts."""
        out = {}
        while self.capturing:
            i = self.capturing.pop()
            said = json.loads(self.remote_parts[i].request({"capture_stop": True}))
            for intf, summary in said.items():
                frames = self.connections[i].read_file(summary.pop("path"))
                (directory / summary["file"]).write_bytes(shift_pcap(frames, -self.clock(i).realtime_ns))
                out[intf] = summary
        return out

    def host(self, name: str) -> RemoteHost:
        return RemoteHost(name, self.remote_parts[self.server_of(name)])

    def stop(self) -> None:
        """Each queue feed and remote part down, then each connection closed; a failure in one does not keep the
        rest up."""
        steps = ([("queue feed", feed.server, feed.stop) for feed in self.queue_feeds]
                 + [("part", part.server, part.stop) for part in self.remote_parts.values()]
                 + [("connection", conn.server, conn.close) for conn in self.connections.values()])
        for what, server, stop in steps:
            try:
                stop()
            except Exception:
                log.exception("%s: stopping its %s failed", server, what)
        self.queue_feeds.clear()
        self.remote_parts.clear()
        self.connections.clear()

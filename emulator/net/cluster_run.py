"""A cluster run (a fabric's planes over several servers), as Mininet has MininetCluster beside Mininet:
`ClusterEmulation` on the machine that runs the controller, `PartEmulation` on each other server (emulator.run.part
starts it over ssh), and `emulation()`, which picks Emulation or ClusterEmulation from the servers a run is given."""

from __future__ import annotations

from pathlib import Path

from emulator.model import capture as tap
from emulator.model.errors import UserError
from emulator.model.fabric import Fabric
from emulator.model.placement import TunnelEnd, subfabric
from emulator.model.servers import Server
from emulator.net import capture
from emulator.net.cluster import Cluster, RemotePart
from emulator.net.emulation import Emulation


def emulation(fabric: Fabric, servers: list[Server] | None = None, ssh_config: Path | None = None,
              **options) -> Emulation:
    """An Emulation, or a ClusterEmulation where `servers` (`localhost` among them) name another server."""
    if servers and any(not server.local for server in servers):
        return ClusterEmulation(fabric, servers, ssh_config, **options)
    return Emulation(fabric, **options)


class ClusterCapture:
    """A capture over several servers: this machine's tcpdumps, and the other servers' parts'."""

    def __init__(self, local: capture.Capture, cluster: Cluster, directory: Path) -> None:
        self.local, self.cluster, self.directory = local, cluster, directory

    def stop(self) -> dict[str, dict]:
        """As Capture.stop, every server's interfaces, their files copied into the one directory."""
        return dict(sorted({**self.local.stop(), **self.cluster.stop_captures(self.directory)}.items()))


class PartEmulation(Emulation):
    """A server's part of a cluster run (emulator.run.part): only `nodes` of the model `fabric` and these tunnel
    ends to the other servers, its switches in the machine's own OVS (they reach the controller over loopback)."""

    def __init__(self, fabric: Fabric, nodes: list[str], tunnels: tuple[TunnelEnd, ...], **options) -> None:
        super().__init__(fabric, **{**options, "switch_daemons": "shared"})
        self.local_fabric, self.tunnels = subfabric(self.fabric, nodes), tunnels


class ClusterEmulation(Emulation):
    """A cluster run seen from the machine that runs the controller: its own part here, the other servers'
    parts over ssh (`ssh_config`: an `ssh -F` file) (emulator.net.cluster); `servers` has `localhost` among
    them. Every server's switches are its machine's own OVS."""

    cluster: Cluster

    def __init__(self, fabric: Fabric, servers: list[Server], ssh_config: Path | None = None, **options) -> None:
        super().__init__(fabric, **{**options, "switch_daemons": "shared"})
        if not (self.external or self.app):
            raise UserError("a run over several servers needs a controller: an app, or --controller",
                            field="servers")
        self.cluster = Cluster(self.fabric, servers, ssh_config)

    def _connect_servers(self) -> None:
        self.cluster.connect(self.state)
        self.local_fabric, self.tunnels = self.cluster.local_part()

    def _queues_elsewhere(self) -> dict[str, dict[str, int]]:
        return self.cluster.queues()

    def _start_parts(self) -> None:
        self.cluster.start_parts(self.state, self.external or ("127.0.0.1", self.controller.port), self.shape)

    def _wait_parts(self) -> None:
        self.timings.update({f"up_s {server}": s for server, s in self.cluster.wait_parts().items()})
        self.cluster.start_queue_feeds(self.state)

    def _stop_parts(self) -> None:
        self.cluster.stop()

    def _connecting_switches(self) -> list[str]:
        return self.fabric.switches()

    def _elsewhere(self, a: str, b: str) -> RemotePart | None:
        i = self.cluster.server_of_interface(a, b)
        return None if i == self.cluster.here else self.cluster.remote_parts[i]

    def host(self, name: str):
        return self.cluster.host(name) if name not in self.local_fabric.graph else super().host(name)

    def start_capture(self, options: tap.CaptureOptions, directory: Path) -> capture.Capture | ClusterCapture:
        """As Emulation.start_capture, each interface on its server."""
        directory.mkdir(parents=True, exist_ok=True)
        here: dict[str, str] = {}
        there: dict[int, list[str]] = {}
        for intf, node in tap.interfaces(self.fabric, options.ports).items():
            i = self.cluster.server_of_interface(node, tap.peer(self.fabric, intf, node))
            if i == self.cluster.here:
                here[intf] = node
            else:
                there.setdefault(i, []).append(intf)
        running = self._capture(here, options.snaplen, directory)
        if not there:
            return running
        try:
            self.cluster.start_captures(there, options.snaplen)
        except BaseException:
            running.stop()
            self.cluster.stop_captures(directory)
            raise
        return ClusterCapture(running, self.cluster, directory)

"""The fabric model as plain Mininet topologies, for `mn --custom`:

    sudo mn --custom emulator/net/mininet_topo.py --topo mpft,planes=2,nodes=16 \\
        --switch ovs,datapath=user,protocols=OpenFlow13,OpenFlow15 \\
        --controller remote,ip=127.0.0.1,port=6653 --link tc

(with `mpft controller --app ecmp --fabric fabric.json` running: `mpft topo ... --save fabric.json` writes
the same model). Note that `mn` runs its global cleanup (`mn` with `-c`) whenever anything fails; `mpft up` does
not. Hosts configure their addresses, routes, static neighbours and sysctls from the model (GpuHost), NVLink
domains are Linux bridges (NVLinkBridge), and links carry their model rate as `bw` (HTB via TCLink).
"""

from __future__ import annotations

import shlex
from typing import Any

from mininet.node import Host, Switch
from mininet.topo import Topo

from emulator.model import hostconfig, naming, topologies
from emulator.model.fabric import Fabric
from emulator.net import ovs


class GpuHost(Host):
    """A Mininet host that applies its model-derived configuration when Mininet configures it."""

    def config(self, setup: hostconfig.HostSetup | None = None, **params: Any) -> dict:
        result = super().config(**params)
        if setup is not None:
            for key, value in setup.sysctls.items():
                self.cmd(shlex.join(["sysctl", "-q", "-w", f"{key}={value}"]))
            for line in setup.ip_lines:
                if line.startswith("addr add"):  # Mininet may already have set the first address
                    self.cmd(shlex.join(["ip", "addr", "flush", "dev", line.split()[-1]]))
                self.cmd(shlex.join(["ip", *line.split()]))
        return result


class NVLinkBridge(Switch):
    """A node's NVLink domain as a Linux learning bridge (no controller, kernel forwarding)."""

    def start(self, _controllers) -> None:
        name = naming.check_name(self.name)
        self.cmd(shlex.join(["ip", "link", "add", "name", name, "type", "bridge", "forward_delay", "0"]))
        for intf in self.intfList():
            if intf.name != "lo":
                self.cmd(shlex.join(["ip", "link", "set", intf.name, "master", name]))
        self.cmd(shlex.join(["ip", "link", "set", name, "up"]))

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 - Mininet's name
        self.cmd(shlex.join(["ip", "link", "del", naming.check_name(self.name)]))
        super().stop(deleteIntfs)

    def connected(self) -> bool:
        return True


class FabricTopo(Topo):
    """Any fabric model as a Mininet Topo; `topo_name` selects the builder, keyword options its parameters."""

    topo_name = topologies.DEFAULT_TOPO

    def build(self, **params: Any) -> None:
        """Builder parameters as Mininet passes them (`--topo mpft,planes=2` gives planes=2)."""
        self.fabric = topologies.build(self.topo_name, **params)
        add_fabric(self, self.fabric)


def add_fabric(topo: Topo, fabric: Fabric) -> None:
    for sw in fabric.switches():
        topo.addSwitch(sw, dpid=f"{fabric.node(sw)['dpid']:016x}", protocols=ovs.PROTOCOLS)
    for domain in fabric.nvlink_domains():
        topo.addSwitch(domain, cls=NVLinkBridge,
                       dpid=f"{naming.dpid('nvlink', 0, fabric.node(domain)['node']):016x}")
    for host in fabric.hosts():
        data = fabric.node(host)
        first = data["ports"][min(data["ports"])]
        topo.addHost(host, cls=GpuHost, ip=f"{first['ip']}/{hostconfig.NIC_PREFIX}", mac=first["mac"],
                     setup=hostconfig.host_setup(fabric, host, set_mtu=False))
    for a, b, d in fabric.graph.edges(data=True):
        macs = {f"addr{i}": fabric.node(n)["ports"][d["ports"][n]]["mac"] for i, n in ((1, a), (2, b))
                if fabric.node(n)["kind"] == "host"}  # hosts' static neighbours expect the model's MACs
        topo.addLink(a, b, port1=d["ports"][a], port2=d["ports"][b], bw=d["bps"] / 1e6, **macs)


def _topo_class(name: str) -> type[FabricTopo]:
    return type(f"{name.upper()}Topo", (FabricTopo,), {"topo_name": name})


topos = {name: _topo_class(name) for name in topologies.BUILDERS}

"""Per-host network configuration derived from the model: addresses, routes, static neighbours, sysctls.

Hosts never ARP (the fabric is looped and the controller does not flood): every neighbour a host can reach
in one hop is written statically, so forwarding keeps working without a controller. GPUs reach GPUs of their
own node over NVLink, GPUs of their plane through their NIC, and other planes through the GPU of their own
node that sits on the destination's plane (NCCL's PXN path), which forwards for its node.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.model import naming
from emulator.model.fabric import Fabric

NIC_PREFIX = 12    # a plane is a /12 (naming.plane_subnet)
NVLINK_PREFIX = 27  # a node's NVLink domain is a /27 (naming.nvlink_ip)


@dataclass
class HostSetup:
    """Commands for one host: `ip -batch` lines and sysctls to set inside its namespace."""

    ip_lines: list[str]
    sysctls: dict[str, str]
    intfs: list[str]


def host_setup(fabric: Fabric, host: str, set_mtu: bool = True) -> HostSetup:
    """Configuration of one host; set_mtu=False leaves the MTU alone (plain Mininet makes 1500-byte veths)."""
    data = fabric.node(host)
    my_ip = data["ip"]
    lines: list[str] = []
    intfs = []
    for port, rec in sorted(data["ports"].items()):
        intf = naming.intf_name(host, port)
        intfs.append(intf)
        prefix = NVLINK_PREFIX if rec["plane"] is None else NIC_PREFIX
        lines.append(f"link set dev {intf} mtu {fabric.mtu} up" if set_mtu else f"link set dev {intf} up")
        lines.append(f"addr add {rec['ip']}/{prefix} dev {intf}")
    lines += _plane_neighbours(fabric, host)
    domain = fabric.nvlink_peer(host)
    if domain is not None:
        lines += _nvlink_routes(fabric, host, domain, my_ip)
    sysctls = {
        "net.ipv6.conf.all.disable_ipv6": "1",  # no ND/MLD chatter into the fabric
        "net.ipv6.conf.default.disable_ipv6": "1",
        "net.ipv4.conf.all.rp_filter": "0",     # PXN replies arrive on another interface
        "net.ipv4.conf.default.rp_filter": "0",
        "net.ipv4.conf.all.send_redirects": "0",
        "net.ipv4.ip_forward": "1" if domain is not None else "0",
    }
    for intf in intfs:
        sysctls[f"net.ipv4.conf.{intf}.rp_filter"] = "0"
    return HostSetup(lines, sysctls, intfs)


def _plane_neighbours(fabric: Fabric, host: str) -> list[str]:
    """Static neighbours for every NIC on each plane this host has a NIC on."""
    lines = []
    for _leaf, port in fabric.nic_links(host):
        plane = fabric.node(host)["ports"][port]["plane"]
        intf = naming.intf_name(host, port)
        lines += [f"neigh replace {rec['ip']} lladdr {rec['mac']} dev {intf} nud permanent"
                  for peer, rec in fabric.plane_nics(plane) if peer != host]
    return lines


def _nvlink_routes(fabric: Fabric, host: str, domain: str, my_ip: str) -> list[str]:
    """Same-node GPUs over NVLink; other planes via the same-node GPU on that plane (PXN)."""
    my_planes = fabric.nic_planes(host)
    nvl_intf = fabric.intf(host, domain)
    lines = []
    for peer in fabric.node_gpus(domain):
        if peer == host:
            continue
        peer_data = fabric.node(peer)
        nvl_port = fabric.port(peer, domain)
        nvl = peer_data["ports"][nvl_port]
        lines.append(f"neigh replace {nvl['ip']} lladdr {nvl['mac']} dev {nvl_intf} nud permanent")
        lines.append(f"neigh replace {peer_data['ip']} lladdr {nvl['mac']} dev {nvl_intf} nud permanent")
        lines.append(f"route replace {peer_data['ip']}/32 dev {nvl_intf} src {my_ip}")
        for rec in peer_data["ports"].values():
            plane = rec["plane"]
            if plane is not None and plane not in my_planes and not fabric.is_storage_plane(plane):
                lines.append(f"route replace {naming.plane_subnet(plane)} via {nvl['ip']} dev {nvl_intf} "
                             f"src {my_ip}")
    return lines

"""Names, datapath ids, MAC and IP addresses derived from position, with the inverse of each.

Positions are (plane, role, index) for switches and (plane, index) for a host's fabric NIC. Every
identifier is a pure function of position, so the emulator, the controller and the analysis agree
without sharing state (the ripl convention).

Address plan:
- fabric NICs: 10.0.0.0/8 split into sixteen /12s, one per plane: plane p, host index i ->
  10.0.0.0 + (p << 20) + i + 1, so plane 0 is 10.0.x.y, plane 1 is 10.16.x.y, plane 2 is 10.32.x.y;
- NVLink ports: 172.16.0.0/12, one /27 per node: node n, GPU g -> 172.16.0.0 + 32 n + g + 1; these never
  leave the node (routes through NVLink carry the fabric address as source);
- MACs: 02:00 followed by the four bytes of the interface's IP address.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

MAX_PLANES = 16
MAX_HOSTS_PER_PLANE = (1 << 20) - 2
MAX_GPUS_PER_NODE = 30  # a node's NVLink /27 has 30 host addresses
MAX_NODES = 1 << 15
IFNAMSIZ = 15  # Linux interface names are at most 15 characters

_FABRIC_BASE = int(ipaddress.IPv4Address("10.0.0.0"))
_NVLINK_BASE = int(ipaddress.IPv4Address("172.16.0.0"))

ROLE_CODES = {"leaf": 1, "spine": 2, "core": 3, "nvlink": 4}
TIERS = {"host": 0, "leaf": 1, "spine": 2, "core": 3}  # hops from the hosts
_ROLE_BY_CODE = {code: role for role, code in ROLE_CODES.items()}
_ROLE_LETTER = {"leaf": "l", "spine": "s", "core": "c"}
_ROLE_BY_LETTER = {letter: role for role, letter in _ROLE_LETTER.items()}

# Every node name this project makes matches this; anything that reaches a command line is checked against it.
NAME_RE = re.compile(r"[a-z][a-z0-9]{0,9}")


def fabric_ip(plane: int, index: int) -> str:
    """Address of host `index`'s NIC on `plane`."""
    if not 0 <= plane < MAX_PLANES:
        raise ValueError(f"plane {plane} outside 0..{MAX_PLANES - 1}")
    if not 0 <= index < MAX_HOSTS_PER_PLANE:
        raise ValueError(f"host index {index} outside 0..{MAX_HOSTS_PER_PLANE - 1}")
    return str(ipaddress.IPv4Address(_FABRIC_BASE + (plane << 20) + index + 1))


def parse_fabric_ip(ip: str) -> tuple[int, int]:
    """Inverse of fabric_ip: (plane, index)."""
    offset = int(ipaddress.IPv4Address(ip)) - _FABRIC_BASE
    if not 0 <= offset < (MAX_PLANES << 20) or not 1 <= (offset & 0xFFFFF) <= MAX_HOSTS_PER_PLANE:
        raise ValueError(f"{ip} is not a fabric address")
    return offset >> 20, (offset & 0xFFFFF) - 1


def plane_subnet(plane: int) -> str:
    """The /12 holding every NIC address of `plane`."""
    return f"{ipaddress.IPv4Address(_FABRIC_BASE + (plane << 20))}/12"


def nvlink_ip(node: int, gpu: int) -> str:
    """Address of GPU `gpu`'s port on node `node`'s NVLink domain."""
    if not 0 <= node < MAX_NODES or not 0 <= gpu < MAX_GPUS_PER_NODE:
        raise ValueError(f"node {node} / gpu {gpu} outside the NVLink address plan")
    return str(ipaddress.IPv4Address(_NVLINK_BASE + 32 * node + gpu + 1))


def parse_nvlink_ip(ip: str) -> tuple[int, int]:
    """Inverse of nvlink_ip: (node, gpu)."""
    offset = int(ipaddress.IPv4Address(ip)) - _NVLINK_BASE
    if not 0 <= offset < 32 * MAX_NODES or not 1 <= offset % 32 <= MAX_GPUS_PER_NODE:
        raise ValueError(f"{ip} is not an NVLink address")
    return offset // 32, offset % 32 - 1


def mac_for_ip(ip: str) -> str:
    """Locally administered MAC carrying the interface's IPv4 address."""
    return "02:00:" + ":".join(f"{b:02x}" for b in ipaddress.IPv4Address(ip).packed)


def ip_for_mac(mac: str) -> str:
    """Inverse of mac_for_ip."""
    parts = mac.lower().split(":")
    if len(parts) != 6 or parts[:2] != ["02", "00"]:
        raise ValueError(f"{mac} is not an mpft-emu MAC")
    return str(ipaddress.IPv4Address(bytes(int(p, 16) for p in parts[2:])))


def dpid(role: str, plane: int, index: int) -> int:
    """Datapath id: role code in bits 48..55, plane in bits 32..47, index in bits 0..31."""
    if not 0 <= plane < 1 << 16 or not 0 <= index < 1 << 32:
        raise ValueError(f"plane {plane} / index {index} outside the datapath id plan")
    return (ROLE_CODES[role] << 48) | (plane << 32) | index


def parse_dpid(value: int) -> tuple[str, int, int]:
    """Inverse of dpid: (role, plane, index)."""
    role = _ROLE_BY_CODE.get(value >> 48)
    if role is None:
        raise ValueError(f"dpid {value:#x} is not an mpft-emu datapath id")
    return role, (value >> 32) & 0xFFFF, value & 0xFFFFFFFF


def switch_name(role: str, plane: int, index: int, storage: bool = False) -> str:
    """`p0l3` is leaf 3 of plane 0; the storage plane's switches are `stl0`, `sts1`."""
    prefix = "st" if storage else f"p{plane}"
    return f"{prefix}{_ROLE_LETTER[role]}{index}"


def nvlink_name(node: int) -> str:
    """The NVLink domain (a kernel bridge in the emulator) of node `node`."""
    return f"n{node}nv"


def gpu_name(node: int, gpu: int) -> str:
    return f"n{node}g{gpu}"


def plain_host_name(index: int) -> str:
    return f"h{index}"


def storage_client_name(node: int) -> str:
    return f"n{node}sc"


def storage_server_name(index: int) -> str:
    return f"ss{index}"


def intf_name(node: str, port: int) -> str:
    """Mininet's convention, `h1-eth0`; checked against Linux's 15-character limit."""
    name = f"{node}-eth{port}"
    if len(name) > IFNAMSIZ:
        raise ValueError(f"interface name {name} is longer than {IFNAMSIZ} characters")
    return name


@dataclass(frozen=True)
class Position:
    """Where a named element sits; the inverse of the *_name functions."""

    kind: str  # "switch", "nvlink", "gpu", "host", "storage_client", "storage_server"
    plane: int | None = None
    role: str | None = None
    index: int | None = None
    node: int | None = None
    gpu: int | None = None
    storage: bool = False


_PATTERNS = [
    (re.compile(r"^p(\d+)([lsc])(\d+)$"),
     lambda m: Position("switch", int(m[1]), _ROLE_BY_LETTER[m[2]], int(m[3]))),
    (re.compile(r"^st([lsc])(\d+)$"),
     lambda m: Position("switch", None, _ROLE_BY_LETTER[m[1]], int(m[2]), storage=True)),
    (re.compile(r"^n(\d+)nv$"), lambda m: Position("nvlink", node=int(m[1]))),
    (re.compile(r"^n(\d+)g(\d+)$"), lambda m: Position("gpu", node=int(m[1]), gpu=int(m[2]))),
    (re.compile(r"^n(\d+)sc$"), lambda m: Position("storage_client", node=int(m[1]), storage=True)),
    (re.compile(r"^ss(\d+)$"), lambda m: Position("storage_server", index=int(m[1]), storage=True)),
    (re.compile(r"^h(\d+)$"), lambda m: Position("host", index=int(m[1]))),
]


def parse_name(name: str) -> Position:
    """Position of a node from its name (the plane of a storage switch is only known to the model)."""
    for pattern, make in _PATTERNS:
        match = pattern.match(name)
        if match:
            return make(match)
    raise ValueError(f"{name!r} is not an mpft-emu node name")


def check_name(name: str) -> str:
    """Refuse any name that is not ours before it reaches a command line."""
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"refusing unsafe node name {name!r}")
    return name

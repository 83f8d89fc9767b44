"""What the runner (emulator.run.launch) and an agent process (traffic.serve, traffic.tcpagent) hand each other, as
typed records: the agent's configuration (`agent.json`) and one host's result (`<host>.json`). Both are JSON written
with `asdict` and read back with emulator.model.records.from_dict, so a field is added in one place and a misspelt
one fails the type checker instead of reading as 0."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from emulator.model.records import from_dict
from traffic.options import TransportOptions


@dataclass
class Port:
    """A host's address and NIC rate on one plane."""

    ip: str
    bps: float


@dataclass
class Egress:
    """A host's egress link rates: its NICs summed, and its NVLink port where it has one."""

    nic: float
    nvlink: float | None = None


@dataclass
class HostInfo:
    """What an agent knows of every host of the run."""

    ip: str
    egress_bps: Egress
    node: int | None = None
    plane: int | None = None
    ports: dict[str, Port] = field(default_factory=dict)  # plane -> its address and rate there


@dataclass
class AgentConfig:
    """`agent.json`: the run directory, the schedule, every host of the schedule, the namespaces of the hosts this
    machine serves, the fabric's figures an agent needs, and the resolved transport options."""

    dir: str
    schedule: str
    hosts: dict[str, HostInfo]
    transport: TransportOptions
    seed: int
    deadline_s: float
    ready_timeout_s: float
    mtu: int = 1500
    queue_bytes: int = 0
    ecn: bool = False
    netns: dict[str, str | None] = field(default_factory=dict)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, path: Path) -> AgentConfig:
        return from_dict(cls, json.loads(path.read_text()))


@dataclass
class Sent:
    """A message this host sent: when it was posted, first left and was acknowledged (CLOCK_MONOTONIC ns)."""

    posted_ns: int
    first_tx_ns: int | None = None
    acked_ns: int | None = None
    retransmits: int = 0


@dataclass
class Delivery:
    """A message this host received: its last byte delivered (in order, where the ordering asks), its first and
    (RDMA) last packet's arrival, and the sender's first byte to here."""

    delivered_ns: int
    first_rx_ns: int
    bytes: int
    one_way_ns: int
    arrived_ns: int | None = None


@dataclass
class CpuTimes:
    """CPU seconds of the agent's process since the start (traffic.eventloop.cpu_since)."""

    user_s: float = 0.0
    system_s: float = 0.0
    total_s: float = 0.0


@dataclass
class Rx:
    packets: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    retransmitted: int = 0
    reorder_distance: dict[str, int] = field(default_factory=dict)  # packets late by k -> how many
    resequence_max: int = 0


@dataclass
class Tx:
    data_packets: int = 0
    retransmits: int = 0
    timeouts: int = 0
    spurious: int = 0
    timeout_lost: int = 0
    timeout_spurious: int = 0
    send_errors: int = 0
    held: int = 0
    flowlets: int = 0
    repaths: int = 0
    reused: int = 0


@dataclass
class Acks:
    sent: int = 0
    received: int = 0


@dataclass
class Datagrams:
    """Every datagram handed to the kernel, every one read back, and those the kernel refused (emulator.net.ledger)."""

    sent: int = 0
    received: int = 0
    refused: int = 0


@dataclass
class EcnCounts:
    ce_received: int = 0
    cnps_sent: int = 0
    cnps_received: int = 0


@dataclass
class PullCounts:
    requests_sent: int = 0
    grants_sent: int = 0
    forgiven: int = 0


@dataclass
class OrderingCounts:
    mode: str = ""
    violations: int = 0
    sends: int = 0


@dataclass
class HostResult:
    """`<host>.json`: what one host's agent measured. `pid` tells apart the processes that served several hosts
    (their CPU times are the process's); `cc` is each queue pair's congestion control state, per algorithm."""

    host: str
    t0_ns: int
    sent: dict[str, Sent] = field(default_factory=dict)  # message id -> ...
    received: dict[str, Delivery] = field(default_factory=dict)
    expected: int = 0
    unexpected: int = 0
    wrong_size: int = 0
    rtt_us: list[float] = field(default_factory=list)
    rtt_seen: int = 0
    timer_lateness_us: dict[str, float] = field(default_factory=dict)  # percentiles
    pid: int = 0
    cpu_s: float = 0.0
    traffic_cpu_s: CpuTimes = field(default_factory=CpuTimes)
    rx: Rx = field(default_factory=Rx)
    tx: Tx = field(default_factory=Tx)
    acks: Acks = field(default_factory=Acks)
    datagrams: Datagrams = field(default_factory=Datagrams)
    ecn: EcnCounts = field(default_factory=EcnCounts)
    pull: PullCounts = field(default_factory=PullCounts)
    ordering: OrderingCounts = field(default_factory=OrderingCounts)
    cc: dict[str, dict[str, Any]] = field(default_factory=dict)  # "peer/qp" -> its state
    scheduling: str = "normal"
    code: str = "python"
    wakeups: int = 0

    def write(self, rundir: Path) -> None:
        """`<host>.json`, atomically: the runner must never read it half-written."""
        out = rundir / f"{self.host}.json"
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.rename(out)

    @classmethod
    def read(cls, path: Path) -> HostResult:
        return from_dict(cls, json.loads(path.read_text()))

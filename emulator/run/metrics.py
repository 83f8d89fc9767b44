"""A job's results as typed records: built once where they are measured, written once (`traffic.json`).

`TransferMetrics` is what the agents measured (emulator.run.launch); `JobMetrics` adds what the job around them
knew and measured: the fabric, the app, the timeline's events, queues, per-plane rates and the fidelity verdict.
`to_dict()` is the file's form; the per-message rows go to `messages.csv`, not into it. Records a study reads
back from files (tags, ordering, fidelity) have defaults, so an older file still loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from emulator.model.records import to_json
from traffic.options import TransportOptions

Summary = dict[str, float]  # emulator.model.stats.percentiles: count, min, p50, p90, p99, max, mean


@dataclass
class Packets:
    data: int
    retransmits: int
    timeouts: int
    spurious: int
    send_errors: int
    received: int
    duplicates: int
    retransmitted: int
    timeout_lost: int = 0  # packets resent after a timeout whose original never arrived
    timeout_spurious: int = 0  # ... whose original had arrived (the round trip outlasted the RTO)
    datagrams_sent: int = 0  # every datagram the agents handed to the kernel: data, ACKs, grants, requests, CNPs
    datagrams_received: int = 0  # every one they read back
    send_refused: int = 0  # sends a host's kernel refused before any queue (a route, a firewall rule)


@dataclass
class Reordering:
    out_of_order: int
    fraction: float  # of the packets received
    distance: Summary
    histogram: dict[int, int]
    resequence_max: int  # packets held at once


@dataclass
class Ordering:
    """Of the send (flag) messages: flag_wait_us, how long each waited at the receiver after its last packet
    until it was delivered; fence_wait_us, how long from posting to its first transmission."""

    mode: str = "psn"
    violations: int = 0
    sends: int = 0
    flag_wait_us: Summary = field(default_factory=dict)
    fence_wait_us: Summary = field(default_factory=dict)


@dataclass
class TagSummary:
    """One traffic tag's messages: how many, how many lost, when the last delivered one arrived, p99 completion,
    and (in a study) the lower bound of its messages alone on the fabric, which a slowdown is measured against."""

    messages: int = 0
    lost: int = 0
    completion_s: float | None = None
    message_p99_s: float | None = None
    lower_bound_s: float | None = None


@dataclass
class ServerSummary:
    """One server's share of a cluster run's fidelity (emulator.run.server_monitors.server_summary): its CPU
    monitor's word, each tunnel's counters (name -> counter -> delta), and how far its clock moved against ours."""

    cpu_bound: bool = False
    cpu_idle: float | None = None  # min; None: not sampled
    cpu_free: float | None = None
    detail: str = ""
    tunnels: dict[str, dict[str, int]] = field(default_factory=dict)
    clock_drift: dict[str, float] | None = None


@dataclass
class ServerSamples:
    """A server's series (emulator.run.server_monitors.merge_samples puts them on our time line): started_ns by its
    clock; link rows (t, kind, name, value), backlogged utilisations per link, each plane's rate (t, Mbit/s),
    the CPU (t, idle, free, busiest switch thread, busiest run process) and the backlogged queues' depths."""

    started_ns: int = 0
    rows: list[tuple] = field(default_factory=list)
    backlogged: dict[str, list[float]] = field(default_factory=dict)
    planes: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    cpu: list[tuple[float, float, float, float, float]] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)


@dataclass
class ServerReport:
    """What a server's part (emulator.run.part) sends back at a run's end beside its agents' results: its summary,
    the bytes each of its switch ports sent, the packets each queue dropped, its ECN marker's counts
    (Emulation.ecn_marks), its pauses (emulator.net.pause.Pauses.record) and its series."""

    summary: ServerSummary = field(default_factory=ServerSummary)
    link_bytes: dict[str, int] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)
    ecn_marks: dict[str, dict] = field(default_factory=dict)
    pauses: dict = field(default_factory=dict)
    samples: ServerSamples = field(default_factory=ServerSamples)


@dataclass
class TransferMetrics:
    """What the agents measured, summed over hosts; `messages` are the per-message rows of messages.csv."""

    transport: TransportOptions
    messages_total: int
    lost_messages: int
    duplicate_or_unexpected: int
    wrong_size: int
    completion_s: float | None
    goodput_bps: float
    by_tag: dict[str, TagSummary]
    message_completion_s: Summary
    packets: Packets
    reordering: Reordering
    rtt_us: Summary
    ordering: Ordering
    agents_cpu_s: float
    timer_lateness_us_p99: float
    agent_processes: int = 0  # the processes that served the hosts
    agent_scheduling: str = ""  # how they ran: realtime, normal (the kernel refused realtime), or both
    agent_code: str = ""  # what they ran: compiled (the mypyc build of the hot path), python, or both
    ecn: dict[str, int] = field(default_factory=dict)  # CE marks the receivers saw, CNPs; the switches' marks
    messages: list[dict] = field(default_factory=list, metadata={"file": "messages.csv"})
    agents_timed_out: dict[str, str] = field(default_factory=dict)  # host -> why its agent was stopped
    servers: dict[str, ServerSummary] = field(default_factory=dict)  # over several servers, each one's
    server_reports: dict[str, ServerReport] = field(default_factory=dict, metadata={"file": "timeseries.csv"})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: to_json(getattr(self, f.name)) for f in fields(self) if "file" not in f.metadata}


@dataclass
class Fidelity:
    """Whether the run can be believed: the CPU monitor's word, how close backlogged links came to their rate,
    and how late the agents' timers fired. `verdict` is emulator.analysis.fidelity.verdict's sentence."""

    cpu_bound: bool = False
    verdict: str = ""
    cpu_idle: float = 1.0
    cpu_free: float = 1.0  # idle plus what other work at a lower priority took (emulator.net.monitor.CpuReport)
    cpu_other: float = 0.0  # the most of the machine such work took in a second
    rate_ratio: float | None = None  # median utilisation of links while backlogged (None: none stayed backlogged)
    rate_ratio_busiest: float = 0.0
    busiest_links: list[dict] = field(default_factory=list)
    timer_lateness_us_p99: float = 0.0
    agents_cpu_s: float = 0.0
    switches_cpu_s: float = 0.0  # every switch daemon, while the CPU monitor sampled
    switch_daemons: str = ""  # "per-plane" or "shared" (emulator.net.switchd)
    feedback_per_drain: float | None = None  # sender-driven cc: how often each sender sees the queue it shares
    # UNFAITHFUL (emulator.analysis.fidelity.unfaithful): a link backlogged below its rate, or packets nothing counts;
    # such a run, like a CPU-bound one, does not count toward an answer
    unfaithful: bool = False
    unfaithful_why: list[str] = field(default_factory=list)
    link_ratio_worst: float | None = None  # the lowest of every link's median utilisation while backlogged
    link_ratio_worst_intf: str = ""
    unattributed_share: float | None = None  # packets no counter explains, of those sent (None: not counted)
    # how long the switch daemons held what they forwarded, on average (s; None: not sampled): queueing the model
    # does not have (monitor.LinkSampler.hidden_delay)
    hidden_delay_s: float | None = None

    @property
    def counts(self) -> bool:
        """Whether the run counts toward an answer: neither CPU-bound nor unfaithful."""
        return not (self.cpu_bound or self.unfaithful)


@dataclass
class JobMetrics(TransferMetrics):
    """A job's traffic.json: the agents' metrics and what the job measured around them."""

    topo: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    app: str = ""
    seed: int = 0
    events: list[dict] = field(default_factory=list)  # the timeline's actions: at_s, ran_at_s, action
    queues: dict[str, float] = field(default_factory=dict)  # deepest egress queue and p99 over backlogged samples
    plane_mbps: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # per plane: (t, Mbit/s)
    fidelity: Fidelity | None = None
    queue_drops: int = 0  # packets every modelled queue (switch ports, host NICs) dropped during the run
    queue_drops_by_port: dict[str, int] = field(default_factory=dict)  # the interfaces that dropped any
    pauses: dict[str, Any] = field(default_factory=dict)  # lossless fabrics: emulator.net.pause's summary
    captures: dict[str, dict] = field(default_factory=dict)  # --capture: per interface, its pcap and packet counts
    # every packet accounted for (emulator.net.ledger.Accounting): sent, delivered, drops per place, the largest
    # names per place, unattributed; {} where not counted (TCP, several servers)
    accounting: dict[str, Any] = field(default_factory=dict)
    # --link-mbps auto: its prediction (emulator.run.autorate) beside the cores the run used, and the error; {}
    cpu_prediction: dict[str, Any] = field(default_factory=dict)
    up_s: float = 0.0
    down_s: float = 0.0



"""How agents move messages: the one table of transport options, their choices, defaults and help.

The command line (`mpft traffic`, `mpft replay`), the scenario checker (a variant's keys) and the agents (their
config's "transport" section) all read `TransportOptions`; a new option is one field here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from emulator.model import wire
from emulator.model.errors import UserError
from traffic import defaults, hotpath
from traffic.cc import PLUGINS
from traffic.entropy import ENTROPY_MODES
from traffic.transport import VISIBLE_ON_ARRIVAL

if TYPE_CHECKING:  # agents read this table: they need no networkx
    from emulator.model.fabric import Fabric

TRANSPORTS = ("rdma", "tcp")
AUTO_CC = "pull"  # what cc auto is with rdma: the plug-in that meets every target of benchmarks/congestion.py
ORDERINGS = tuple(VISIBLE_ON_ARRIVAL)
_KERNEL_CC = re.compile(r"[a-z0-9_]{1,16}")


def _option(default: Any, help: str, *, choices: tuple[str, ...] = (), low: float | None = None,
            high: float | None = None, user: bool = True) -> Any:
    """A field of the table: `user` options are command-line flags and scenario variant keys."""
    return field(default=default, metadata={"help": help, "choices": choices, "low": low, "high": high,
                                            "user": user})


@dataclass(frozen=True)
class TransportOptions:
    """transport rdma is our RoCEv2-like queue pairs; tcp is one kernel TCP connection per queue pair, and cc
    then names a kernel algorithm. ordering (rdma) says when a write or a send becomes visible to the receiving
    application: psn (in PSN order, as RoCE delivers), none (each message when all of its packets are in), fence
    (as none, but a send is posted only after every earlier message of its queue pair is acknowledged), release
    (as none, but a send becomes visible only after every earlier message of its queue pair)."""

    transport: str = _option("rdma", "rdma (RoCEv2-like queue pairs) or tcp (kernel TCP)", choices=TRANSPORTS)
    cc: str = _option("auto", f"congestion control (auto: {AUTO_CC}, the plug-in that meets the congestion "
                              "targets); with transport tcp a kernel algorithm such as cubic instead (none or auto "
                              "keeps the kernel's default)", choices=("auto", *PLUGINS))
    entropy: str = _option("fixed", "UDP source port per packet", choices=ENTROPY_MODES)
    window: int = _option(0, "packets in flight per queue pair, at most 63 (the selective-ack bitmap covers 64); "
                             "0: from the fabric (cc none: the bandwidth-delay product, at least one packet; "
                             "with a cc: its ceiling, one switch queue)", low=0, high=63)
    min_rto_ms: float = _option(0.0, "least retransmission timeout in ms, also the first; 0: from the fabric (a "
                                     "base round trip plus the full queues on the longest path, drained at their "
                                     "rates: a smaller one retransmits what is only queued); rdma",
                                low=0.0, high=60000.0)
    ordering: str = _option("psn", "when writes and sends become visible", choices=ORDERINGS)
    flowlet_gap_ms: float = _option(20.0, "idle gap that starts a new flowlet (entropy flowlet)", low=1e-3,
                                    high=1e4)
    ack_every: int = _option(1, "acknowledge every n-th data packet of a queue pair (ACK coalescing, as RoCE NICs "
                                "do); a message's last packet, duplicates, CE marks and packets after a gap are "
                                "acknowledged at once, and no ACK waits longer than n packet times; rdma",
                             low=1, high=64)
    agent_processes: int = _option(0, "processes the hosts' agents share (0: one per CPU core; the host count: "
                                      "one per host); transport rdma", low=0, high=100_000)
    agent_scheduling: str = _option("realtime", "realtime: agent processes run SCHED_FIFO at the lowest priority, "
                                    "so their timers fire on time while the switches load the cores (the kernel "
                                    "keeps 5% for the rest); normal: as any process", choices=("realtime", "normal"))
    agent_code: str = _option("auto", "auto: the agents' hot path compiled by mypyc while that build is current "
                              "(make setup builds it), else the source; compiled or python to insist (rdma)",
                              choices=hotpath.CODES)
    wake_slack: float = _option(0.1, "how early, in packet times at the host's NIC rate, an agent may send, grant, "
                                     "flush ACKs or time out, so that one wake-up serves the work due soon after "
                                     "it (this machine charges a process 30-70 us per wake-up); the host's own "
                                     "qdisc still shapes the wire; 0: exactly on time; rdma", low=0.0, high=1.0)
    cnp_interval_ms: float = _option(0.0, "least time between two congestion notifications (cc ecn; 0: DCQCN's "
                                          "timer, from the fabric)", low=0.0, high=1e4, user=False)
    cc_params: dict = field(default_factory=dict, metadata={"help": "the cc plug-in's parameters", "user": False})

    @classmethod
    def user_fields(cls) -> list:
        """The options a user sets, in the order they are checked (cc and ordering depend on transport)."""
        return [f for f in fields(cls) if f.metadata["user"]]

    @staticmethod
    def check_value(name: str, value: Any, transport: str = "rdma") -> Any:
        """One option's value, checked on its own (UserError naming the field otherwise)."""
        meta = next(f for f in fields(TransportOptions) if f.name == name).metadata
        if name == "cc" and transport == "tcp":
            if not isinstance(value, str) or not _KERNEL_CC.fullmatch(value):
                raise UserError(f"must be a kernel TCP congestion control such as cubic, reno or bbr, or none, "
                                f"got {value!r}", field=name)
            return value
        choices = ("psn",) if name == "ordering" and transport == "tcp" else meta["choices"]
        if choices and (not isinstance(value, str) or value not in choices):
            hint = " (TCP delivers every connection in order)" if name == "ordering" and transport == "tcp" else ""
            raise UserError(f"must be one of {', '.join(choices)}, got {value!r}{hint}", field=name)
        low, high = meta.get("low"), meta.get("high")
        if low is not None:
            whole = isinstance(low, int) and isinstance(high, int)
            kinds = (int,) if whole else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
                raise UserError(f"must be a {'whole number' if whole else 'number'} from {low:g} to {high:g}, "
                                f"got {value!r}", field=name)
        return value

    def check(self, fabric: Fabric, tcp_controls: Sequence[str] = ()) -> None:
        """Refuse what cannot work before anything starts; `tcp_controls` are the kernel's TCP algorithms."""
        for f in self.user_fields():
            self.check_value(f.name, getattr(self, f.name), self.transport)
        if self.transport == "tcp":
            if self.cc not in ("none", "auto") and self.cc not in tcp_controls:
                raise UserError(f"this kernel has no TCP congestion control {self.cc!r} (it has "
                                f"{', '.join(tcp_controls)}; none keeps the kernel's default)", field="cc")
        elif self.agent_code == "compiled" and hotpath.current() is None:
            raise UserError("no current mypyc build of the agents' hot path (make setup builds it; it needs gcc and "
                            "python3-dev)", field="agent_code")
        elif self.cc == "ecn" and not fabric.ecn:
            raise UserError("cc=ecn needs switches that mark ECN: build the fabric with --ecn (RED, or the eBPF "
                            "marker where the kernel has no RED; `mpft doctor` says which is there)", field="cc")

    def for_fabric(self, fabric: Fabric) -> TransportOptions:
        """These options with what was left to the fabric filled in (traffic.defaults): the window and the least
        RTO (0); rtt's initial window (the bandwidth-delay product: its window is then only the ceiling) and base
        RTT; pull's grant limit and unscheduled packets (the bandwidth-delay product); DCQCN's timer and the CNP
        interval (its feedback delay); cc auto, what it stands for."""
        options = self.concrete_cc()
        if options.transport != "rdma":
            return options
        if options.window == 0:
            options = replace(options, window=defaults.model_window(fabric, options.cc))
        if options.min_rto_ms == 0:
            options = replace(options, min_rto_ms=round(defaults.model_min_rto_ms(fabric), 3))
        period_s = defaults.dcqcn_period_s(fabric)
        if options.cnp_interval_ms == 0:
            options = replace(options, cnp_interval_ms=round(1e3 * period_s, 3))
        fabric_params: dict = {}
        if options.cc == "rtt":
            fabric_params = {"initial_window": defaults.model_window(fabric, "none"),
                             "base_rtt_ms": 1e3 * defaults.base_rtt_s(fabric)}
        elif options.cc == "pull":
            fabric_params = {"grant_limit": defaults.model_grant_limit(fabric),
                             "unscheduled": defaults.model_window(fabric, "none")}
        elif options.cc == "ecn":
            fabric_params = {"timer_packets": period_s * defaults.slowest_nic_bps(fabric)
                             / ((fabric.mtu + wire.ETH) * 8)}
        return replace(options, cc_params={**fabric_params, **options.cc_params})

    def concrete_cc(self) -> TransportOptions:
        """cc auto made what it means: AUTO_CC with rdma, the kernel's default (none) with tcp."""
        if self.cc != "auto":
            return self
        return replace(self, cc=AUTO_CC if self.transport == "rdma" else "none")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransportOptions:
        """What an agent reads from its config: unknown keys are a bug, missing ones take the defaults."""
        return cls(**data)

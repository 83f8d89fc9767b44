"""Congestion control plug-ins for the transport, one object per queue pair.

Each plug-in sets two limits the sender obeys: `rate_bps` (pacing) and `window` (packets in flight), and hears
about acknowledgements (with an RTT sample and whether the packet was ECN-marked), congestion notification
packets (CNPs) and losses.

- `none`: paced at line rate with a fixed window — what a NIC without congestion control does.
- `rtt`: delay-based in the style of Swift / TIMELY: additive increase while the RTT is below a target, a
  multiplicative decrease proportional to the excess (at most once per RTT) above it.
- `pull`: receiver-driven in the style of NDP, EQDS and Homa: a sender sends only what the receiver grants
  (traffic.granter.Granter: one packet at a time at the receiver's link rate, in turn among its senders), beyond
  a small unscheduled first window (the receiver's queue divided by its fan-in); its window is only a ceiling.
- `ecn`: rate-based in the style of DCQCN: cut the rate on a CNP (the receiver sends one when packets arrive
  ECN-marked by the switches), recover in fast-recovery then additive steps. Needs switches that mark ECN: the
  fabric must be built with `ecn=True` (RED, or emulator.net.marking's eBPF marker where the kernel has no RED).

The hardware constants (DCQCN's 55 us timer, Swift's per-hop targets) are for 100-400 Gbit/s links; here time
scales with the emulated packet time (one MTU at line rate), so the same dynamics play out at 10 Mbit/s.
Write your own by subclassing `CongestionControl` and adding it to `PLUGINS`.
"""

from __future__ import annotations

import math
from typing import ClassVar


class CongestionControl:
    name: ClassVar[str] = "none"
    receiver_driven: ClassVar[bool] = False  # the receiver grants what may be sent (the agent runs a Granter)

    def __init__(self, line_bps: float, packet_bits: int, window: int = 32) -> None:
        self.line_bps = line_bps
        self.packet_bits = packet_bits
        self.packet_ns = packet_bits / line_bps * 1e9  # one full packet at line rate
        self.max_window = window
        self.rate_bps = line_bps
        self.window = window

    def on_ack(self, now_ns: int, rtt_ns: int, srtt_ns: float, min_rtt_ns: float, acked: int) -> None:
        """`acked` packets were newly acknowledged; `rtt_ns` is the sample from the packet that triggered it."""

    def on_cnp(self, now_ns: int) -> None:
        """The receiver saw ECN-marked packets of this queue pair."""

    def on_loss(self, now_ns: int) -> None:
        """A retransmission timeout fired."""

    def tick(self, now_ns: int) -> None:
        """For timer-driven schemes: called at next_tick_ns (or later), and whenever the agent checks timers."""

    def next_tick_ns(self) -> float:
        """When tick has work next (the agent sleeps until then)."""
        return math.inf

    def state(self) -> dict:
        return {"rate_bps": self.rate_bps, "window": self.window}


class RttBased(CongestionControl):
    """Swift-like: target delay = the fabric's base RTT + `queue_packets` packet times of queueing + a flow-scaled
    part (Swift's: up to `fs_packets` more packet times as the window shrinks towards `min_cwnd`, none at the
    ceiling), so that many flows sharing a bottleneck, each with a small window, settle on a short queue instead
    of cutting each other to nothing. The base is `base_rtt_ms` (the runner passes the fabric's, as Swift is
    configured with its fabric's), else the lowest RTT seen: in an all-to-all every queue fills before a queue
    pair's first sample, and a base learnt from those keeps them full. It starts at `initial_window` packets (0: a
    quarter of the ceiling; the runner passes the fabric's bandwidth-delay product)."""
    name: ClassVar[str] = "rtt"

    def __init__(self, line_bps: float, packet_bits: int, window: int = 32, queue_packets: float = 2.0,
                 ai: float = 1.0, beta: float = 0.8, max_mdf: float = 0.5, min_cwnd: float = 0.1,
                 initial_window: float = 0.0, fs_packets: float = 4.0, base_rtt_ms: float = 0.0) -> None:
        super().__init__(line_bps, packet_bits, window)
        self.base_ns = base_rtt_ms * 1e6
        self.cwnd = min(float(initial_window), float(window)) if initial_window > 0 else float(window) / 4
        self.queue_ns = queue_packets * self.packet_ns
        self.ai, self.beta, self.max_mdf, self.min_cwnd = ai, beta, max_mdf, min_cwnd
        self.fs_ns = fs_packets * self.packet_ns
        low, high = 1 / math.sqrt(min_cwnd), 1 / math.sqrt(max(float(window), min_cwnd * 2))
        self.fs_alpha, self.fs_beta = 1 / (low - high), -high / (low - high)  # 1 at min_cwnd, 0 at the ceiling
        self.last_decrease = 0
        self.rtt_ns = 0
        self._apply()

    def target_ns(self, min_rtt_ns: float) -> float:
        scaled = min(max(self.fs_alpha / math.sqrt(self.cwnd) + self.fs_beta, 0.0), 1.0)
        return (self.base_ns or min_rtt_ns) + self.queue_ns + scaled * self.fs_ns

    def _apply(self) -> None:
        """Window from cwnd; pacing spreads cwnd packets over the latest RTT, as Swift's pacing delay does (below
        one packet that sets the gap; a smoothed RTT would lag the queue by several of a small window's sparse
        samples, and the rate with it)."""
        self.window = max(1, min(self.max_window, math.ceil(self.cwnd)))
        if self.rtt_ns:
            self.rate_bps = min(self.line_bps, self.cwnd * self.packet_bits / (self.rtt_ns / 1e9))

    def on_ack(self, now_ns: int, rtt_ns: int, srtt_ns: float, min_rtt_ns: float, acked: int) -> None:
        target = self.target_ns(min_rtt_ns)
        if rtt_ns < target:
            self.cwnd += self.ai * acked / max(self.cwnd, 1.0) if self.cwnd >= 1 else self.ai * acked * self.cwnd
        elif now_ns - self.last_decrease >= srtt_ns:
            factor = max(1 - self.beta * (rtt_ns - target) / rtt_ns, 1 - self.max_mdf)
            self.cwnd *= factor
            self.last_decrease = now_ns
        self.cwnd = min(max(self.cwnd, self.min_cwnd), float(self.max_window))
        self.rtt_ns = rtt_ns
        self._apply()

    def on_loss(self, now_ns: int) -> None:
        self.cwnd = max(self.cwnd * (1 - self.max_mdf), self.min_cwnd)
        self.last_decrease = now_ns
        self._apply()

    def state(self) -> dict:
        return {**super().state(), "cwnd": self.cwnd}


class Dcqcn(CongestionControl):
    """DCQCN-like (Zhu et al., SIGCOMM 2015): alpha tracks how often CNPs come; timers are in packet times.
    Hardware's timer (55 us) is about its feedback delay, a queue at Kmax drained plus a round trip; the runner
    passes the fabric's in `timer_packets` (and sends CNPs as far apart, as hardware's 50 us are). After a cut,
    `fast_recovery` periods halve the way back to the rate before it; then each period adds `rai_fraction` of line
    rate, hardware's 40 Mbit/s of 40 Gbit/s (measured on an incast 15 -> 1: 0.5 % swung its queue between empty
    and 70 %, and a hyper-increase stage after 10 periods without a CNP between empty and full). g is 4x
    hardware's 1/256: a run here lasts hundreds of timers, not tens of thousands, and alpha must settle in it."""
    name: ClassVar[str] = "ecn"

    def __init__(self, line_bps: float, packet_bits: int, window: int = 32, g: float = 1 / 64,
                 timer_packets: float = 10.0, fast_recovery: int = 5, rai_fraction: float = 0.001,
                 min_rate_fraction: float = 0.01) -> None:
        super().__init__(line_bps, packet_bits, window)
        self.g = g
        self.period_ns = timer_packets * self.packet_ns
        self.fast_recovery = fast_recovery
        self.rai = rai_fraction * line_bps
        self.min_rate = min_rate_fraction * line_bps
        self.alpha = 1.0
        self.target = line_bps
        self.stage = 0
        self.cnp_seen = False
        self.next_alpha = self.next_increase = 0.0

    def on_cnp(self, now_ns: int) -> None:
        self.target = self.rate_bps
        self.rate_bps = max(self.rate_bps * (1 - self.alpha / 2), self.min_rate)
        self.alpha = (1 - self.g) * self.alpha + self.g
        self.cnp_seen = True
        self.stage = 0
        self.next_alpha = self.next_increase = now_ns + self.period_ns

    def on_loss(self, now_ns: int) -> None:
        self.on_cnp(now_ns)

    def tick(self, now_ns: int) -> None:
        if not self.next_alpha:
            return
        if now_ns >= self.next_alpha:
            if not self.cnp_seen:
                self.alpha *= 1 - self.g
            self.cnp_seen = False
            self.next_alpha = now_ns + self.period_ns
        if now_ns >= self.next_increase:
            if self.stage >= self.fast_recovery:
                self.target = min(self.target + self.rai, self.line_bps)
            self.rate_bps = min((self.rate_bps + self.target) / 2, self.line_bps)
            self.stage += 1
            self.next_increase = now_ns + self.period_ns

    def next_tick_ns(self) -> float:
        return min(self.next_alpha, self.next_increase) if self.next_alpha else math.inf

    def state(self) -> dict:
        return {**super().state(), "alpha": self.alpha}


class Pull(CongestionControl):
    """Receiver-driven: line-rate pacing and the window as a ceiling; what may be sent comes from the receiver's
    grants (SendConnection.grant). `grant_limit` is the receiver's (traffic.granter.Granter: granted packets not
    yet arrived, in all; the runner passes what one switch queue holds), `unscheduled` the most a queue pair sends
    unasked (the runner passes the fabric's bandwidth-delay product: what covers the first round trip; more only
    queues, and sprayed, reorders)."""
    name: ClassVar[str] = "pull"
    receiver_driven: ClassVar[bool] = True

    def __init__(self, line_bps: float, packet_bits: int, window: int = 32, grant_limit: int = 6,
                 unscheduled: int = 0) -> None:
        super().__init__(line_bps, packet_bits, window)
        self.grant_limit = grant_limit
        self.unscheduled = unscheduled or window


PLUGINS: dict[str, type[CongestionControl]] = {"none": CongestionControl, "rtt": RttBased, "ecn": Dcqcn,
                                               "pull": Pull}

"""Per-flow measurement records shared by the traffic tools."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FlowResult:
    """One flow's outcome, measured at the receiver."""

    src: str
    dst: str
    seconds: float
    sent_bytes: int
    received_bytes: int
    goodput_bps: float
    retransmits: int = 0
    congestion: str = ""
    error: str = ""

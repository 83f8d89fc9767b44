"""Single TCP flows with iperf3 between emulated hosts, and iperf3's JSON turned into a FlowResult."""

from __future__ import annotations

import json
import shlex
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


def parse_iperf3(text: str, src: str, dst: str) -> FlowResult:
    """A client's `iperf3 -J` output as a FlowResult; iperf3's own errors are kept, not raised."""
    try:
        data = json.loads(text[text.index("{"):] if "{" in text else text)
    except json.JSONDecodeError:
        return FlowResult(src, dst, 0.0, 0, 0, 0.0, error="no JSON output")
    if not isinstance(data, dict):
        return FlowResult(src, dst, 0.0, 0, 0, 0.0, error="iperf3 output is not a JSON object")
    if "error" in data and "end" not in data:
        return FlowResult(src, dst, 0.0, 0, 0, 0.0, error=str(data["error"]))
    end = data.get("end", {})
    sent, received = end.get("sum_sent", {}), end.get("sum_received", {})
    return FlowResult(src, dst, seconds=float(received.get("seconds", 0.0)),
                      sent_bytes=int(sent.get("bytes", 0)), received_bytes=int(received.get("bytes", 0)),
                      goodput_bps=float(received.get("bits_per_second", 0.0)),
                      retransmits=int(sent.get("retransmits", 0)),
                      congestion=end.get("sender_tcp_congestion", ""), error=str(data.get("error", "")))


def clients_output(emu, pairs: list[tuple[str, str]], args: list[str], port: int = 5201) -> list[str]:
    """Run `iperf3 -c dst -J ARGS` in each src's shell against a one-off server at its dst, all pairs at once
    (every source and every destination a different host); the clients' outputs, in order."""
    servers = [emu.popen(dst, ["iperf3", "-s", "-1", "-p", str(port)]) for _src, dst in pairs]
    emu.host(pairs[0][0]).cmd("sleep 0.3")  # let the servers listen
    for src, dst in pairs:
        emu.host(src).sendCmd(shlex.join(["iperf3", "-c", emu.fabric.ip(dst), "-p", str(port), "-J", *args]))
    outputs = [emu.host(src).waitOutput() for src, _dst in pairs]
    for server in servers:
        server.wait(timeout=10)
    return outputs


def client_output(emu, src: str, dst: str, args: list[str], port: int = 5201) -> str:
    """One client's output (clients_output)."""
    return clients_output(emu, [(src, dst)], args, port)[0]


def run_flow(emu, src: str, dst: str, seconds: float, port: int = 5201, congestion: str | None = None) -> FlowResult:
    """One TCP flow from src to dst for `seconds`."""
    args = ["-t", f"{seconds:g}", "--connect-timeout", "5000", *(["-C", congestion] if congestion else [])]
    return parse_iperf3(client_output(emu, src, dst, args, port), src, dst)

"""TCP flows with iperf3 between emulated hosts, and its JSON turned into flow results.

An iperf3 server serves one test at a time, so a destination runs one one-off server (`-1`) per peer, on
port BASE_PORT + the peer's index. Every host starts its servers, then its clients, with one shell command,
all hosts at once.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from emulator.errors import EnvironmentProblem

BASE_PORT = 5201


@dataclass
class FlowResult:
    src: str
    dst: str
    seconds: float
    sent_bytes: int
    received_bytes: int
    goodput_bps: float
    retransmits: int
    congestion: str = ""
    error: str = ""


def parse_iperf3(text: str, src: str, dst: str) -> FlowResult:
    """A client's `iperf3 -J` output as a FlowResult; iperf3's own errors are kept, not raised."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return FlowResult(src, dst, 0.0, 0, 0, 0.0, 0, error="no JSON output")
    if "error" in data and "end" not in data:
        return FlowResult(src, dst, 0.0, 0, 0, 0.0, 0, error=str(data["error"]))
    end = data.get("end", {})
    sent, received = end.get("sum_sent", {}), end.get("sum_received", {})
    return FlowResult(src, dst, seconds=float(received.get("seconds", 0.0)),
                      sent_bytes=int(sent.get("bytes", 0)), received_bytes=int(received.get("bytes", 0)),
                      goodput_bps=float(received.get("bits_per_second", 0.0)),
                      retransmits=int(sent.get("retransmits", 0)),
                      congestion=end.get("sender_tcp_congestion", ""), error=str(data.get("error", "")))


def _background(commands: list[list[str]], wait: bool) -> str:
    """One shell line starting every command in the background (and waiting for them if asked)."""
    line = " ".join(f"{shlex.join(c)} >/dev/null 2>&1 &" for c in commands)
    return f"{line} wait" if wait else line


def run_pairs(emu, pairs: list[tuple[str, str]], seconds: float, outdir: Path,
              congestion: str | None = None) -> list[FlowResult]:
    """Run one TCP flow per (src, dst) pair, all at once, for `seconds`; returns receiver-side goodput."""
    fabric = emu.fabric
    index = {h: i for i, h in enumerate(fabric.hosts())}
    outdir.mkdir(parents=True, exist_ok=True)
    servers: dict[str, list[list[str]]] = {}
    clients: dict[str, list[list[str]]] = {}
    for src, dst in pairs:
        port = str(BASE_PORT + index[src])
        servers.setdefault(dst, []).append(["iperf3", "-s", "-1", "-p", port])
        client = ["iperf3", "-c", fabric.ip(dst), "-p", port, "-t", f"{seconds:g}", "-J",
                  "--connect-timeout", "5000", "--logfile", str(outdir / f"{src}-{dst}.json")]
        if congestion:
            client += ["-C", congestion]
        clients.setdefault(src, []).append(client)
    for dst, cmds in servers.items():
        emu.host(dst).cmd(_background(cmds, wait=False))
    _wait_listening(emu, {dst: len(cmds) for dst, cmds in servers.items()})
    for src, cmds in clients.items():
        emu.host(src).sendCmd(_background(cmds, wait=True))
    for src in clients:
        emu.host(src).waitOutput()
    results = []
    for src, dst in pairs:
        path = outdir / f"{src}-{dst}.json"
        text = path.read_text() if path.exists() else ""
        results.append(parse_iperf3(text, src, dst))
    return results


def _wait_listening(emu, expected: dict[str, int], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    pending = dict(expected)
    while pending and time.monotonic() < deadline:
        for host, count in list(pending.items()):
            listening = emu.host(host).cmd("ss -Hltn").count("LISTEN")
            if listening >= count:
                del pending[host]
        if pending:
            time.sleep(0.1)
    if pending:
        raise EnvironmentProblem(f"iperf3 servers did not start on {', '.join(sorted(pending)[:4])}")

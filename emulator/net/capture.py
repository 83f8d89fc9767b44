"""Packet captures of chosen interfaces into pcap files a researcher opens in Wireshark or scapy: one tcpdump per
interface, started in the interface's namespace (an argument list, never a shell line), its process recorded like
any other of the run's (so teardown, `mpft clean` and the CPU monitor find it), stopped before teardown so every
file is complete. Frames are cut to `snaplen` bytes: headers only by default (the RoCEv2 headers are within
emulator.model.capture.MIN_SNAPLEN), the whole frame with a larger one.
"""

from __future__ import annotations

import re
import select
import signal
import struct
import subprocess
import time
from pathlib import Path

from emulator.model.errors import EnvironmentProblem

STOP_TIMEOUT_S = 5.0


class Capture:
    """The running tcpdumps of one run (interface -> process and file)."""

    def __init__(self, procs: dict[str, subprocess.Popen], files: dict[str, Path]) -> None:
        self.procs, self.files = procs, files

    def wait_listening(self, timeout_s: float = 10.0) -> None:
        """Until every tcpdump has opened its interface (it says so on stderr), so the first frames are in."""
        deadline = time.monotonic() + timeout_s
        for intf, proc in self.procs.items():
            line = ""
            while "listening on" not in line:
                left = deadline - time.monotonic()
                if proc.poll() is not None or left <= 0 or not select.select([proc.stderr], [], [], left)[0]:
                    raise EnvironmentProblem(f"tcpdump on {intf} did not start: {line.strip() or 'no output'}")
                line = proc.stderr.readline()

    def stop(self) -> dict[str, dict]:
        """Stop every tcpdump (it writes out what it holds) and say, per interface, its file and what it counted."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        out = {}
        for intf, proc in self.procs.items():
            try:
                _, err = proc.communicate(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            counts = {k: int(n) for n, k in re.findall(r"(\d+) packets? (captured|dropped by kernel)", err or "")}
            out[intf] = {"file": self.files[intf].name, "packets": counts.get("captured", 0),
                         "dropped": counts.get("dropped by kernel", 0)}
        return out


PCAP_MAGIC = {0xA1B2C3D4: 1000, 0xA1B23C4D: 1}  # a pcap's magic -> ns per unit of its time stamps' fraction
PCAP_HEADER, PCAP_RECORD = 24, struct.Struct("IIII")  # ts_sec, ts_fraction, captured length, original length


def shift_pcap(data: bytes, by_ns: int) -> bytes:
    """A pcap with every frame's time stamp moved by `by_ns` (another server's capture, on our clock); pcapng,
    or anything else, unchanged."""
    if len(data) < PCAP_HEADER or not by_ns:
        return data
    for order in "<>":
        unit = PCAP_MAGIC.get(struct.unpack_from(order + "I", data)[0])
        if unit:
            break
    else:
        return data
    record = struct.Struct(order + PCAP_RECORD.format)
    out, at = bytearray(data), PCAP_HEADER
    while at + record.size <= len(data):
        seconds, fraction, captured, original = record.unpack_from(data, at)
        moved = seconds * 10**9 + fraction * unit + by_ns
        record.pack_into(out, at, moved // 10**9, moved % 10**9 // unit, captured, original)
        at += record.size + captured
    return bytes(out)


def tcpdump_argv(intf: str, path: Path, snaplen: int) -> list[str]:
    """tcpdump writing `intf`'s frames (both directions) to `path` as they come (without --immediate-mode the
    kernel hands them over a block at a time, and those of the last block are lost when it stops), as root (-Z:
    the run directory is root's until the run hands it over)."""
    return ["tcpdump", "-i", intf, "-s", str(snaplen), "--immediate-mode", "-U", "-w", str(path), "-Z", "root",
            "-n", "-q"]

"""Traces in, schedules out: which importer reads a file (the pcap replay on a live fabric is emulator.run.pcap).

Formats (`--format auto` picks by name): `jsonl` (our trace format, emulator.model.schedule), `hpcc` (HPCC's ns-3
flow.txt, traffic.hpcc), `chakra` (ASTRA-sim's per-rank .et files, traffic.chakra; give one rank's file or the
prefix; process groups come from the trace or a communicator-group file), `pcap` (raw frames,
traffic.pcapreplay). Message traces written for 100-400 Gbit/s fabrics are far too large for 10 Mbit/s links:
`scale` multiplies every message's bytes (at least 1 byte each)."""

from __future__ import annotations

from pathlib import Path

from emulator.model import schedule
from emulator.model.errors import UserError
from emulator.model.fabric import Fabric
from emulator.model.schedule import Message
from traffic import chakra, hpcc

FORMATS = ("auto", "jsonl", "hpcc", "chakra", "pcap")


def detect(path: Path) -> str:
    name = path.name
    if name.endswith((".pcap", ".cap", ".pcapng")):
        return "pcap"
    if name.endswith(".et") or not path.exists() and Path(f"{path}.0.et").exists():
        return "chakra"
    if name.endswith((".jsonl", ".json")):
        return "jsonl"
    if name.endswith(".txt"):
        return "hpcc"
    raise UserError("cannot tell the trace format from the name: give --format", file=str(path))


def load_messages(path: Path, fabric: Fabric, fmt: str = "auto", scale: float = 1.0,
                  hpcc_topology: Path | None = None, comm_groups: Path | None = None) -> tuple[list[Message], str]:
    """A message trace as a schedule for `fabric`, and a one-line summary of what the importer did. For HPCC,
    `hpcc_topology` (its topology.txt) maps the topology's host ids, rather than the flows' ids, onto hosts; for
    Chakra, `comm_groups` (ASTRA-sim's communicator-group JSON) defines process groups."""
    fmt = detect(path) if fmt == "auto" else fmt
    if comm_groups is not None and fmt != "chakra":
        raise UserError(f"only a Chakra trace has process groups, this is {fmt}", field="comm_groups")
    if not scale > 0:
        raise UserError("must be > 0", field="scale")
    if fmt == "jsonl":
        messages = schedule.read(path, fabric.hosts())
        summary = f"{len(messages)} messages"
    elif fmt == "hpcc":
        topology = hpcc.read_topology(hpcc_topology) if hpcc_topology else None
        result = hpcc.read_flows(path, fabric.gpu_hosts(), topology)
        messages, summary = result.messages, result.summary()
    elif fmt == "chakra":
        result = chakra.load(path, fabric.gpu_hosts(), comm_groups)
        messages, summary = result.messages, result.summary()
    else:
        raise UserError(f"{fmt} is not a message trace", field="format")
    if scale != 1.0:
        messages = schedule.scaled(messages, scale)
        summary += f"; bytes scaled by {scale:g}"
    return messages, summary

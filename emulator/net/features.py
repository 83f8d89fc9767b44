"""What this machine's kernel and Open vSwitch can do, detected at run time, and what that enables.

Probing is kept apart from deciding: `probe()` gathers raw facts (needs root for the qdisc probe), and
`decide()` turns facts into the features the emulator uses, so the decision is unit-tested for both a
module-less CI kernel and a stock distribution kernel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from emulator.model.errors import UserError
from emulator.model.fabric import Fabric
from emulator.net import marking

QDISCS = ("htb", "tbf", "pfifo", "bfifo", "netem", "red", "fq_codel", "prio", "ingress", "clsact")

# A minimal valid configuration per qdisc kind, tried on the loopback of a throwaway network namespace.
_QDISC_PROBES = {
    "htb": ["root", "handle", "1:", "htb"],
    "tbf": ["root", "tbf", "rate", "1mbit", "burst", "32kb", "latency", "50ms"],
    "pfifo": ["root", "pfifo", "limit", "10"],
    "bfifo": ["root", "bfifo", "limit", "10000"],
    "netem": ["root", "netem", "delay", "1ms"],
    "red": ["root", "red", "limit", "400000", "min", "30000", "max", "90000", "avpkt", "1000",
            "burst", "55", "probability", "0.02", "bandwidth", "10mbit", "ecn"],
    "fq_codel": ["root", "fq_codel"],
    "prio": ["root", "prio"],
    "ingress": ["ingress"],
    "clsact": ["clsact"],
}


@dataclass
class Facts:
    """Raw observations of one machine."""

    ovs_kernel_module: bool
    qdiscs: dict[str, bool]
    tcp_congestion: list[str]
    ovs_running: bool = False
    ovs_version: str = ""
    tools: dict[str, bool] = field(default_factory=dict)
    ecn_bpf_missing: str = "not probed"  # why the eBPF ECN marker cannot work here, '' if it can


@dataclass
class Features:
    """What the emulator will use on this machine, and what it cannot offer here."""

    datapath: str  # "kernel" or "user"
    shaping: bool  # HTB with a byte FIFO leaf
    link_delay: bool  # netem
    link_loss: bool  # netem
    ecn_marking: bool  # switches can mark ECN: with RED, or with the eBPF marker (ecn_marker says which)
    tcp_congestion: list[str]
    unavailable: list[str]
    ecn_marker: str = ""  # "red", "bpf" (emulator.net.marking), or "" (none)
    lossless: bool = False  # lossless links (emulator.net.pause), which need the eBPF marker's queues


MARKERS = ("auto", "red", "bpf")  # MPFT_ECN_MARKER: auto takes RED where the kernel has it, else the eBPF marker


def decide(facts: Facts, marker_choice: str = "auto") -> Features:
    """Choose datapath and link features from the facts (and the ECN marker asked for: MARKERS); list what is
    missing and why."""
    if marker_choice not in MARKERS:
        raise UserError(f"must be one of {', '.join(MARKERS)}, got {marker_choice!r}", field="MPFT_ECN_MARKER")
    missing = []
    if not facts.ovs_kernel_module:
        missing.append("OVS kernel datapath (no openvswitch module): using the userspace datapath")
    netem = facts.qdiscs.get("netem", False)
    red = facts.qdiscs.get("red", False)
    if not netem:
        missing.append("link delay, jitter and loss (no netem qdisc)")
    bpf = not facts.ecn_bpf_missing and facts.qdiscs.get("clsact", False)
    present = {"red": red, "bpf": bpf}
    marker = next((m for m in ("red", "bpf") if present[m] and marker_choice in ("auto", m)), "")
    if not marker and marker_choice != "auto":
        missing.append(f"ECN marking by {marker_choice} (MPFT_ECN_MARKER): "
                       f"{'no RED qdisc' if marker_choice == 'red' else facts.ecn_bpf_missing or 'no clsact qdisc'}")
    elif not marker:
        why = facts.ecn_bpf_missing or "no clsact qdisc"
        missing.append(f"ECN marking and ECN-based congestion control (no RED qdisc; eBPF marker: {why})")
    if "dctcp" not in facts.tcp_congestion:
        missing.append("TCP DCTCP")
    if not (bpf and facts.qdiscs.get("tbf", False)):
        missing.append(f"lossless (PFC) links (they need the eBPF marker and tbf: "
                       f"{facts.ecn_bpf_missing or 'no clsact or tbf qdisc'})")
    shaping = facts.qdiscs.get("htb", False) and facts.qdiscs.get("bfifo", False)
    if not shaping:
        missing.append("link shaping (needs htb and bfifo): links would run unshaped")
    return Features(datapath="kernel" if facts.ovs_kernel_module else "user", shaping=shaping,
                    link_delay=netem, link_loss=netem, ecn_marking=bool(marker),
                    tcp_congestion=facts.tcp_congestion, unavailable=missing, ecn_marker=marker,
                    lossless=bpf and facts.qdiscs.get("tbf", False))


def _kernel_module_loaded(name: str) -> bool:
    """True if the module is in the kernel, loading it first where the kernel takes modules."""
    if Path(f"/sys/module/{name}").exists():
        return True
    if Path("/proc/modules").exists() and shutil.which("modprobe"):
        subprocess.run(["modprobe", "-q", name], capture_output=True, check=False)
    return Path(f"/sys/module/{name}").exists()


def default_datapath() -> str:
    """The datapath runs use unless told: the kernel's where it has the openvswitch module (cheap: no qdisc probe)."""
    return "kernel" if _kernel_module_loaded("openvswitch") else "user"


def probe_qdiscs() -> dict[str, bool]:
    """Try each qdisc on the loopback of a fresh network namespace: nothing is left behind."""
    result = {}
    for kind, args in _QDISC_PROBES.items():
        run = subprocess.run(["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", *args],
                             capture_output=True, check=False)
        result[kind] = run.returncode == 0
    return result


def tcp_congestion_controls() -> list[str]:
    """Available TCP congestion controls, loading DCTCP's module first where the kernel takes modules."""
    path = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
    if not path.exists():
        return []
    if "dctcp" not in path.read_text().split():
        _kernel_module_loaded("tcp_dctcp")
    return path.read_text().split()


def ovs_status() -> tuple[bool, str]:
    if not shutil.which("ovs-vsctl"):
        return False, ""
    run = subprocess.run(["ovs-vsctl", "--timeout=5", "get", "Open_vSwitch", ".", "ovs_version"],
                         capture_output=True, text=True, check=False)
    return run.returncode == 0, run.stdout.strip().strip('"')


def probe() -> Facts:
    running, version = ovs_status()
    tools = {t: shutil.which(t) is not None for t in ("mnexec", "ovs-vsctl", "iperf3", "ethtool", "tc", "ip")}
    return Facts(ovs_kernel_module=_kernel_module_loaded("openvswitch"), qdiscs=probe_qdiscs(),
                 tcp_congestion=tcp_congestion_controls(), ovs_running=running, ovs_version=version,
                 tools=tools, ecn_bpf_missing=marking.missing())


_cached: Features | None = None


def detect() -> Features:
    """Probe once per process and decide."""
    global _cached
    if _cached is None:
        _cached = decide(probe(), os.environ.get("MPFT_ECN_MARKER", "auto"))
    return _cached


def check_link_options(fabric: Fabric, feats: Features) -> None:
    """Refuse, before anything starts, link options this kernel cannot emulate."""
    if (fabric.delay_ms or fabric.loss_pct) and not feats.link_delay:
        name = "delay_ms" if fabric.delay_ms else "loss_pct"
        raise UserError("link delay and loss need the netem qdisc, unavailable on this kernel (see 'mpft doctor'; "
                        "the Vagrant VM has it)", field=name)
    if fabric.ecn and not feats.ecn_marking:
        raise UserError("ECN marking needs the RED qdisc or the eBPF marker (clang, libbpf-dev and clsact), "
                        "unavailable on this kernel (see 'mpft doctor'; `make setup` installs the marker's tools)",
                        field="ecn")
    if fabric.lossless:
        if not feats.lossless:
            raise UserError("lossless links need the eBPF marker (clang, libbpf-dev and clsact) and the tbf qdisc, "
                            "unavailable on this kernel (see 'mpft doctor')", field="lossless")
        for sw in fabric.switches():
            for peer in fabric.graph[sw]:
                xoff, _xon, headroom = fabric.pause_thresholds(sw, peer)
                if xoff < 2 * (fabric.mtu + 14):
                    need = -(-(headroom + 2 * (fabric.mtu + 14)) // 1024)
                    raise UserError(f"lossless: {sw}'s port to {peer} needs {headroom // 1024} KiB of headroom for "
                                    f"its {len(fabric.feeders(sw, peer))} feeders, leaving less than two frames "
                                    f"below XOFF; give it a queue of at least {need} KiB", field="queue_kb")

"""ECN marking where the kernel has no RED: the eBPF program in ecn_marker.bpf.c (its comment says how it keeps
a port's backlog), compiled with clang for each run, attached by tc at every switch port's clsact egress, and
told the ports, their rates and the thresholds through its maps, which tc pins by name under PIN_DIR. The maps
are read and written with bpf(2) through ctypes (Python has no binding, and bpftool is not needed). The marking
curve is RED's without the averaging: none below kmin, rising linearly to pmax at kmax, certain from kmax on;
kmin == kmax is DCTCP's step at K.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from emulator.model.errors import EnvironmentProblem
from emulator.model.fabric import Fabric

SOURCE = Path(__file__).with_name("ecn_marker.bpf.c")
OBJECT = "ecn_marker.bpf.o"
BPFFS = Path("/sys/fs/bpf")
PIN_DIR = BPFFS / "tc" / "globals"  # where tc's loader pins maps declared LIBBPF_PIN_BY_NAME
MAPS = ("mpft_ecn_slot", "mpft_ecn_port", "mpft_ecn_count")
SECTION = "mpft/mark"
HEADERS = Path("/usr/include/bpf/bpf_helpers.h")  # libbpf-dev
PORT = struct.Struct("=IIqQQQQQQ")  # struct port: lock, pmax, level, updated, rate, burst, limit, kmin, kmax
COUNTS = struct.Struct("=QQQ")  # struct counts: marked, seen, peak
SLOT = struct.Struct("=I")
INTF = struct.Struct("=QII")  # struct intf: namespace cookie, ifindex, pad
SO_NETNS_COOKIE = 71
NR_BPF = 321  # x86_64
BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, BPF_OBJ_GET = 1, 2, 7
BPF_F_LOCK = 4  # copy a value under its spin lock
ALWAYS = 0xFFFFFFFF


@dataclass(frozen=True)
class Thresholds:
    """Where a port starts marking (kmin), where it always marks (kmax), the probability at kmax, in bytes of
    backlog; `limit` is its queue's."""

    limit: int
    kmin: int
    kmax: int
    pmax: float

    def probability(self, backlog: int) -> float:
        """The chance that a packet arriving at this backlog is marked: what the program computes."""
        if backlog < self.kmin:
            return 0.0
        if backlog >= self.kmax:
            return 1.0
        return self.pmax * (backlog - self.kmin) / (self.kmax - self.kmin)

    def packed(self, rate_bps: float, burst: int) -> bytes:
        """A port's map entry at this rate and HTB burst, its queue empty."""
        return PORT.pack(0, round(self.pmax * ALWAYS), -burst, 0, round(rate_bps / 8), burst, self.limit,
                         self.kmin, self.kmax)


def missing() -> str:
    """Why the marker cannot work here ('' if it can): it is built, then loaded on the loopback of a throwaway
    network and mount namespace with a BPF filesystem of its own, so nothing is left behind (a kernel whose tc
    programs lack a helper it calls refuses it there)."""
    if not shutil.which("clang"):
        return "no clang to build the eBPF marker"
    if not HEADERS.exists():
        return f"no {HEADERS} (libbpf-dev) to build the eBPF marker"
    with tempfile.TemporaryDirectory(prefix="mpft-ecn-probe-") as directory:
        try:
            obj = build(Path(directory))
        except EnvironmentProblem as exc:
            return exc.message
        load = (f"mount -t bpf bpf {BPFFS} && tc qdisc add dev lo clsact && "
                f"tc filter add dev lo egress bpf da obj {shlex.quote(str(obj))} sec {SECTION}")
        done = subprocess.run(["unshare", "--net", "--mount", "sh", "-c", load], capture_output=True, text=True,
                              check=False)
    if done.returncode != 0:
        return f"the kernel refused the eBPF marker: {(done.stderr.strip().splitlines() or ['?'])[-1][:200]}"
    return ""


def build(directory: Path) -> Path:
    """Compile the program into `directory`; the object's path."""
    out = directory / OBJECT
    arch_include = f"/usr/include/{os.uname().machine}-linux-gnu"
    run = subprocess.run(["clang", "-O2", "-g", "-target", "bpf", "-Wall", "-Werror", f"-I{arch_include}",
                          "-c", str(SOURCE), "-o", str(out)], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise EnvironmentProblem(f"clang could not build {SOURCE.name}: {run.stderr.strip()[:300]}")
    return out


def bpffs_mounted() -> bool:
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1:3] == [str(BPFFS), "bpf"] for line in mounts)


def mount_bpffs(note: Path) -> None:
    """Mount the BPF filesystem where tc pins maps, unless it is there; `note` records that we did, so whoever
    cleans up after us (unmount_bpffs) knows it is ours to take away, even after a crash."""
    if bpffs_mounted():
        return
    done = subprocess.run(["mount", "-t", "bpf", "bpf", str(BPFFS)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise EnvironmentProblem(f"cannot mount the BPF filesystem at {BPFFS}: {done.stderr.strip()[:200]}")
    note.write_text("mpft-emu mounted the BPF filesystem at " + str(BPFFS) + "\n")


def unmount_bpffs(note: Path) -> None:
    """Unmount the BPF filesystem if `note` says we mounted it and nothing else was pinned there since."""
    if not note.exists():
        return
    if bpffs_mounted() and not any(p.is_file() for p in BPFFS.rglob("*") if p.parent != BPFFS):
        subprocess.run(["umount", str(BPFFS)], capture_output=True, check=False)
    note.unlink()


def thresholds(fabric: Fabric) -> Thresholds:
    """The ports' marking thresholds, the fabric's (`ecn_kmin_kb`, `ecn_kmax_kb`, `ecn_pmax`), as RED gets them
    where the kernel has it (emulator.net.shaping)."""
    kmin, kmax, pmax = fabric.ecn_thresholds
    return Thresholds(limit=fabric.queue_bytes, kmin=kmin, kmax=kmax, pmax=pmax)


def remove_pins() -> int:
    """Unpin our maps (the kernel frees them once no program holds them); how many there were."""
    removed = 0
    for name in MAPS:
        try:
            (PIN_DIR / name).unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def netns_cookie() -> int:
    """The cookie of the network namespace this thread is in, as the program's bpf_get_netns_cookie sees it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return struct.unpack("=Q", sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8))[0]


def tc_lines(intf: str, obj: Path) -> list[str]:
    """tc batch lines hooking the program to a port's egress."""
    return [f"qdisc add dev {intf} clsact", f"filter add dev {intf} egress pref 1 bpf da obj {obj} sec {SECTION}"]


_libc = ctypes.CDLL(None, use_errno=True)


def _bpf(cmd: int, attr: bytes) -> int:
    buf = ctypes.create_string_buffer(attr, 128)
    fd = _libc.syscall(NR_BPF, cmd, buf, len(buf))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


class PinnedMap:
    """One of the program's maps, opened by its pin."""

    def __init__(self, name: str) -> None:
        path = ctypes.create_string_buffer(str(PIN_DIR / name).encode())
        try:
            self.fd = _bpf(BPF_OBJ_GET, struct.pack("=QII", ctypes.addressof(path), 0, 0))
        except OSError as exc:
            raise EnvironmentProblem(f"the ECN marker's map {name} is not pinned: {exc.strerror}") from exc

    def _elem(self, cmd: int, key: bytes, value: ctypes.Array, flags: int) -> None:
        k = ctypes.create_string_buffer(key, len(key))
        _bpf(cmd, struct.pack("=IIQQQ", self.fd, 0, ctypes.addressof(k), ctypes.addressof(value), flags))

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        self._elem(BPF_MAP_UPDATE_ELEM, key, ctypes.create_string_buffer(value, len(value)), flags)

    def lookup(self, key: bytes, size: int, flags: int = 0) -> bytes:
        value = ctypes.create_string_buffer(size)
        self._elem(BPF_MAP_LOOKUP_ELEM, key, value, flags)
        return value.raw

    def close(self) -> None:
        os.close(self.fd)


class Marker:
    """The marker of one run once tc has loaded it: each marked port's slot, and what it counted."""

    def __init__(self, ports: dict[str, tuple[tuple[int, int], float]], thresholds: Thresholds, burst: int) -> None:
        """`ports`: port name -> ((its namespace's cookie, its ifindex), its rate in bit/s); `burst`: the HTB
        burst of every port, bytes (emulator.net.shaping)."""
        self.thresholds, self.burst = thresholds, burst
        self.slots = {name: slot for slot, name in enumerate(sorted(ports))}
        slots, self.port_map, self.count_map = (PinnedMap(name) for name in MAPS)
        try:
            for name, (intf, rate_bps) in ports.items():
                slot = SLOT.pack(self.slots[name])
                slots.update(INTF.pack(*intf, 0), slot)
                self.port_map.update(slot, thresholds.packed(rate_bps, burst))
        finally:
            slots.close()

    def set_rate(self, name: str, rate_bps: float) -> None:
        """A port's new rate (a degraded or restored link), its queue as it stands."""
        key = SLOT.pack(self.slots[name])
        fields = list(PORT.unpack(self.port_map.lookup(key, PORT.size, BPF_F_LOCK)))
        fields[4] = round(rate_bps / 8)
        self.port_map.update(key, PORT.pack(*fields), BPF_F_LOCK)

    def backlog(self, name: str) -> int:
        """The port's backlog as the program keeps it, brought up to now (bytes)."""
        _lock, _pmax, level, updated, rate, burst, *_ = PORT.unpack(
            self.port_map.lookup(SLOT.pack(self.slots[name]), PORT.size, BPF_F_LOCK))
        drained = max(0, time.monotonic_ns() - updated) // 1000 * rate // 1_000_000
        return max(0, max(level - drained, -burst))

    def counts(self) -> dict[str, dict[str, int]]:
        """Per port: packets marked, packets queued, and the deepest backlog, as the program counted them."""
        result = {}
        for name, slot in self.slots.items():
            marked, seen, peak = COUNTS.unpack(self.count_map.lookup(SLOT.pack(slot), COUNTS.size))
            result[name] = {"marked": marked, "queued": seen, "peak_bytes": peak}
        return result

    def close(self) -> None:
        self.port_map.close()
        self.count_map.close()

"""ECN marking where the kernel has no RED: the eBPF program in ecn_marker.bpf.c (its comment says how it keeps
a port's backlog), compiled with clang for each run, attached by tc at every switch port's clsact egress, and
told the ports, their rates and the thresholds through its maps, which tc pins by name under PIN_DIR. The maps
are read and written with bpf(2) through ctypes (Python has no binding, and bpftool is not needed). The marking
curve is RED's without the averaging: none below kmin, rising linearly to pmax at kmax, certain from kmax on;
kmin == kmax is DCTCP's step at K. On a lossless fabric the program also reports a backlog passing xoff on a
ring buffer (XoffEvents), for emulator.net.pause. A port queueing per traffic class keeps a backlog per class
(share_out says how the port's drain is shared among them), and marks and reports each class's own.
"""

from __future__ import annotations

import ctypes
import mmap
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
MAPS = ("mpft_ecn_slot", "mpft_ecn_port", "mpft_ecn_gate", "mpft_ecn_count", "mpft_ecn_xoff")
SECTION = "mpft/mark"
HEADERS = Path("/usr/include/bpf/bpf_helpers.h")  # libbpf-dev
TCLASSES, SHARES = 8, 3  # the program's: traffic classes, and how often a drain is shared out again
# struct port: lock, pmax, level, drained, burst, limit, kmin, kmax, xoff, classes, pad, queued[TCLASSES]
PORT = struct.Struct(f"=IIqQQQQQQII{TCLASSES}Q")
GATE = struct.Struct("=IIQQQII")  # struct gate: lock, congested, drained, since, rate, paused, pad
XOFF_EVENT = struct.Struct("=IIQQ")  # struct xoff_event: slot, tclass, backlog, at
RING_BYTES = 1 << 16  # mpft_ecn_xoff's max_entries
RING_BUSY, RING_DISCARD = 1 << 31, 1 << 30  # a ring record header's flags
KICK_PRIORITY = 0x10002  # frames with it are not counted (emulator.net.pause sends them)
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

    def packed(self, burst: int, xoff: int = 0, classes: bool = False) -> bytes:
        """A port's map entry with this HTB burst, its queues empty; `xoff` > 0: lossless, pausing above it;
        `classes`: a queue per traffic class."""
        return PORT.pack(0, round(self.pmax * ALWAYS), -burst, 0, burst, self.limit, self.kmin, self.kmax, xoff,
                         int(classes), 0, *[0] * TCLASSES)


def share_out(queued: list[int], paused: int, sent: int) -> tuple[list[int], int]:
    """What the program does with `sent` bytes of a port queueing per class: shared equally among the classes
    holding packets whose bit in `paused` is clear (one with less than its part empties, and the rest is shared
    again among the others, SHARES times over), as HTB's round robin of equal quanta shares the link between busy
    classes (HTB also sends a class within its guaranteed rate first, which this leaves out: up to its burst, two
    frames, benchmarks/marking.py measures it). The queues after it, and what no class took (unspent tokens)."""
    queued = list(queued)
    for _ in range(SHARES):
        open_ = [c for c in range(TCLASSES) if queued[c] and not paused >> c & 1]
        part = sent // len(open_) if open_ else 0
        for c in open_:
            take = min(queued[c], part)
            queued[c] -= take
            sent -= take
    return queued, sent


def _timens_offset_ns() -> int:
    """How far this process's CLOCK_MONOTONIC is ahead of the kernel's own: a time namespace's offset (0 outside
    one). The program's clock (bpf_ktime_get_ns) is the kernel's, whatever namespace we are in."""
    try:
        for line in Path("/proc/self/timens_offsets").read_text().splitlines():
            clock, seconds, nanoseconds = line.split()
            if clock == "monotonic":
                return int(seconds) * 10**9 + int(nanoseconds)
    except OSError:
        pass
    return 0


TIMENS_OFFSET_NS = _timens_offset_ns()


def kernel_ns() -> int:
    """Now, by the program's clock."""
    return time.monotonic_ns() - TIMENS_OFFSET_NS


def gate_entry(rate_bps: float, drained: int = 0, since: int = 0, congested: int = 0, paused: int = 0) -> bytes:
    """A port's drain: `drained` bytes by `since` (ns, the program's clock: kernel_ns), at `rate_bps` from then
    on; `congested` and `paused`: a bit per class (bit 0 for a FIFO)."""
    return GATE.pack(0, congested, drained, since, round(rate_bps / 8), paused, 0)


def drain_at(entry: bytes, now: int) -> int:
    """What the program computes from a gate entry: bytes the port has sent by `now`."""
    _lock, _congested, drained, since, rate, _paused, _pad = GATE.unpack(entry)
    us = max(0, now - since) // 1000
    return drained + rate // 1_000_000 * us + rate % 1_000_000 * us // 1_000_000


def missing() -> str:
    """Why the marker cannot work here ('' if it can): it is built, then loaded on the loopback of a throwaway
    network and mount namespace with a BPF filesystem of its own, so nothing is left behind (a kernel whose tc
    programs lack a helper it calls refuses it there). Kernels before 6.15 refuse bpf_get_netns_cookie in tc
    programs: then the build without it is tried (by_cookie() says which loaded)."""
    global _by_cookie
    if not shutil.which("clang"):
        return "no clang to build the eBPF marker"
    if not HEADERS.exists():
        return f"no {HEADERS} (libbpf-dev) to build the eBPF marker"
    refused = ""
    for cookie in (True, False):
        with tempfile.TemporaryDirectory(prefix="mpft-ecn-probe-") as directory:
            try:
                obj = build(Path(directory), cookie)
            except EnvironmentProblem as exc:
                return exc.message
            load = (f"mount -t bpf bpf {BPFFS} && tc qdisc add dev lo clsact && "
                    f"tc filter add dev lo egress bpf da obj {shlex.quote(str(obj))} sec {SECTION}")
            done = subprocess.run(["unshare", "--net", "--mount", "sh", "-c", load], capture_output=True,
                                  text=True, check=False)
        if done.returncode == 0:
            _by_cookie = cookie
            return ""
        refused = refused or (done.stderr.strip().splitlines() or ["?"])[-1][:200]
    return f"the kernel refused the eBPF marker: {refused}"


_by_cookie: bool | None = None


def by_cookie() -> bool:
    """Whether this kernel's tc programs tell namespaces apart (bpf_get_netns_cookie, Linux 6.15 on); probes once."""
    if _by_cookie is None:
        missing()
    return bool(_by_cookie)


def build(directory: Path, cookie: bool | None = None) -> Path:
    """Compile the program into `directory` (with bpf_get_netns_cookie where the kernel has it, or `cookie`);
    the object's path."""
    cookie = by_cookie() if cookie is None else cookie
    out = directory / OBJECT
    arch_include = f"/usr/include/{os.uname().machine}-linux-gnu"
    run = subprocess.run(["clang", "-O2", "-g", "-target", "bpf", "-Wall", "-Werror", f"-I{arch_include}",
                          *([] if cookie else ["-DMPFT_NO_NETNS_COOKIE"]), "-c", str(SOURCE), "-o", str(out)],
                         capture_output=True, text=True, check=False)
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


def thresholds(fabric: Fabric, marks: bool = True) -> Thresholds:
    """The ports' marking thresholds, the fabric's (`ecn_kmin_kb`, `ecn_kmax_kb`, `ecn_pmax`), as RED gets them
    where the kernel has it (emulator.net.shaping); `marks` False (a lossless fabric without ECN): never."""
    kmin, kmax, pmax = fabric.ecn_thresholds if marks else (fabric.queue_bytes + 1,) * 2 + (0.0,)
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
    """The cookie of the network namespace this thread is in, as the program's bpf_get_netns_cookie sees it (0
    where the program was built without it)."""
    if not by_cookie():
        return 0
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

    def __init__(self, ports: dict[str, tuple[tuple[int, int], float]], thresholds: Thresholds, burst: int,
                 xoff: dict[str, int] | None = None, classes: frozenset[str] = frozenset()) -> None:
        """`ports`: port name -> ((its namespace's cookie, its ifindex), its rate in bit/s); `burst`: the HTB
        burst of every port, bytes (emulator.net.shaping); `xoff`: lossless ports' pause thresholds; `classes`:
        the ports queueing per traffic class."""
        self.thresholds, self.burst, self.classes = thresholds, burst, classes
        self.slots = {name: slot for slot, name in enumerate(sorted(ports))}
        self.names = {slot: name for name, slot in self.slots.items()}
        slots, self.port_map, self.gate_map, self.count_map = (PinnedMap(name) for name in MAPS[:4])
        try:
            for name, (intf, rate_bps) in ports.items():
                slot = SLOT.pack(self.slots[name])
                slots.update(INTF.pack(*intf, 0), slot)
                self.gate_map.update(slot, gate_entry(rate_bps, since=kernel_ns()))
                self.port_map.update(slot, thresholds.packed(burst, (xoff or {}).get(name, 0), name in classes))
        finally:
            slots.close()

    def _gate(self, name: str) -> tuple[bytes, bytes]:
        key = SLOT.pack(self.slots[name])
        return key, self.gate_map.lookup(key, GATE.size, BPF_F_LOCK)

    def set_rate(self, name: str, rate_bps: float, sent: int = 0) -> None:
        """A port's new rate (a degraded or restored link; 0 while paused), its queue as it stands: what it sent
        at the old rate is folded in first, and `sent` bytes the port sends at once (a paused gate's refilled
        bucket lets a frame go: uncounted, it put the program a frame above the real queue per pause, 41 KB on an
        incast's ports). The program only ever sets `congested`, which is carried over (if it sets it in between,
        it finds it clear and reports again)."""
        key, entry = self._gate(name)
        now = kernel_ns()
        _lock, congested, _drained, _since, _rate, paused, _pad = GATE.unpack(entry)
        self.gate_map.update(key, gate_entry(rate_bps, drain_at(entry, now) + sent, now, congested, paused),
                             BPF_F_LOCK)

    def _change_bit(self, name: str, field: int, bit: int, on: bool) -> None:
        """Set or clear one bit of a gate's `congested` (field 1) or `paused` (field 5); the program only ever
        sets `congested` bits, so a report it makes in between is at worst made again."""
        key, entry = self._gate(name)
        fields = list(GATE.unpack(entry))
        fields[field] = fields[field] | 1 << bit if on else fields[field] & ~(1 << bit)
        self.gate_map.update(key, GATE.pack(*fields), BPF_F_LOCK)

    def clear_congested(self, name: str, tclass: int = 0) -> None:
        """The port's (class's) backlog is back at xon: the next one above xoff is reported again."""
        self._change_bit(name, 1, tclass, False)

    def set_paused(self, name: str, tclass: int, paused: bool) -> None:
        """A port queueing per class: one class held or let go (the others share the port's drain meanwhile).
        The program shares out what the port sent since its last packet as the classes are paused when the next
        one comes: emulator.net.pause sends a frame through the port just before (one the qdisc drops), so the
        time before the change is shared as it was."""
        self._change_bit(name, 5, tclass, paused)

    def backlog(self, name: str, tclass: int = 0) -> int:
        """The port's backlog (of `tclass`, on a port queueing per class) as the program keeps it, brought up to
        now (bytes)."""
        key, entry = self._gate(name)
        fields = PORT.unpack(self.port_map.lookup(key, PORT.size, BPF_F_LOCK))
        level, drained = fields[2], fields[3]
        sent = max(0, drain_at(entry, kernel_ns()) - drained)
        if name in self.classes:
            return share_out(list(fields[11:]), GATE.unpack(entry)[5], sent)[0][tclass]
        return max(0, level - sent)

    def resync(self, real: dict[str, int], tolerance: int) -> dict[str, int]:
        """Bring each port's queue as the program keeps it to `real`, its qdisc's backlog read just before, where
        the two differ by more than `tolerance` bytes; how far each port was off (the program's less the real one).
        The program drains at the nominal rate, and a link that sends a little below it (0.90-0.98 of it at a run's
        start, measured) left the program's queue ~60 KB below the real one for the 50 s it stayed backlogged, so
        ECN marks and pauses came late. A packet the program counts between the read and the write is left out
        until the next resync. Ports queueing per class are left alone (their drain is shared out by class)."""
        off = {}
        for name in real.keys() & self.slots.keys() - self.classes:
            key, entry = self._gate(name)
            fields = list(PORT.unpack(self.port_map.lookup(key, PORT.size, BPF_F_LOCK)))
            drained = max(drain_at(entry, kernel_ns()), fields[3])
            level = max(fields[2] - (drained - fields[3]), -fields[4])
            if max(level, 0) != real[name]:
                off[name] = max(level, 0) - real[name]
            if abs(off.get(name, 0)) > tolerance:
                fields[2:4] = real[name], drained
                self.port_map.update(key, PORT.pack(*fields), BPF_F_LOCK)
        return off

    def counts(self) -> dict[str, dict[str, int]]:
        """Per port: packets marked, packets queued, and the deepest backlog, as the program counted them."""
        result = {}
        for name, slot in self.slots.items():
            marked, seen, peak = COUNTS.unpack(self.count_map.lookup(SLOT.pack(slot), COUNTS.size))
            result[name] = {"marked": marked, "queued": seen, "peak_bytes": peak}
        return result

    def close(self) -> None:
        for pinned in (self.port_map, self.gate_map, self.count_map):
            pinned.close()


class XoffEvents:
    """The program's reports of a lossless port's backlog passing xoff, read from its ring buffer, which the
    kernel maps into our memory: a consumer position we write, then the producer's position and the data (mapped
    twice over, so a record is contiguous even where it wraps). Its descriptor polls readable when records wait.
    """

    def __init__(self) -> None:
        self.map = PinnedMap(MAPS[4])
        page = mmap.PAGESIZE
        self.consumer = mmap.mmap(self.map.fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self.producer = mmap.mmap(self.map.fd, page + 2 * RING_BYTES, mmap.MAP_SHARED, mmap.PROT_READ,
                                  offset=page)
        self.data = page

    def fileno(self) -> int:
        return self.map.fd

    def take(self) -> list[tuple[int, int, int, int]]:
        """(slot, traffic class, backlog bytes, when in our CLOCK_MONOTONIC ns) of every report waiting, oldest
        first."""
        out = []
        (position,) = struct.unpack_from("=Q", self.consumer, 0)
        (end,) = struct.unpack_from("=Q", self.producer, 0)
        while position < end:
            at = self.data + position % RING_BYTES
            (header,) = struct.unpack_from("=I", self.producer, at)
            if header & RING_BUSY:
                break
            length = header & ~(RING_BUSY | RING_DISCARD)
            if not header & RING_DISCARD:
                slot, tclass, backlog, when = XOFF_EVENT.unpack_from(self.producer, at + 8)
                out.append((slot, tclass, backlog, when + TIMENS_OFFSET_NS))
            position += (8 + length + 7) & ~7
        struct.pack_into("=Q", self.consumer, 0, position)
        return out

    def close(self) -> None:
        self.consumer.close()
        self.producer.close()
        self.map.close()

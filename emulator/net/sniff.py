"""Frames seen on interfaces, with the kernel's time stamps: what a pause or a mark did, judged from the packets on
both sides of a port rather than from the mechanism's own word (the lossless test and benchmarks/pause.py).

One thread reads an AF_PACKET socket per interface (opened in the interface's namespace) and keeps, per frame,
when the kernel saw it, which way it went and its length, in memory: a short run's worth, not a pcap.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from dataclasses import dataclass

from emulator.net.shaping import TOS_SHIFT
from traffic.kernel import socket_buffer
from traffic.netns import entered

ETH_P_ALL, ETH_P_IP = 0x0003, 0x0800
PACKET_OUTGOING = 4
SO_TIMESTAMPNS = 35
TIMESPEC = struct.Struct("=qq")
HEAD = 64


@dataclass(frozen=True)
class Frame:
    at_ns: int  # CLOCK_REALTIME, as the kernel stamped it
    intf: str
    outgoing: bool  # sent by this interface (after its qdisc), else received
    length: int  # bytes, without the FCS
    head: bytes  # its first HEAD bytes: the headers of a RoCEv2 packet, up to its BTH

    @property
    def dst(self) -> bytes:
        return self.head[:6]

    @property
    def ethertype(self) -> int:
        return int.from_bytes(self.head[12:14], "big")

    @property
    def tclass(self) -> int | None:
        """An IPv4 frame's traffic class (its IP precedence), as the ports' filters read it; None for others."""
        return self.head[15] >> TOS_SHIFT if self.ethertype == ETH_P_IP else None


class Sniffer:
    """Record every frame on `intfs` (interface -> namespace path, None: this one) until stopped."""

    def __init__(self, intfs: dict[str, str | None]) -> None:
        self.frames: list[Frame] = []
        self.socks: dict[int, tuple[str, socket.socket]] = {}
        for intf, netns in intfs.items():
            with entered(netns):
                sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                socket_buffer(sock, socket.SO_RCVBUF, 8 << 20)
                sock.bind((intf, ETH_P_ALL))
                sock.setblocking(False)
            self.socks[sock.fileno()] = (intf, sock)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sniff", daemon=True)

    def __enter__(self) -> Sniffer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.05)  # the last frames reach the sockets
        self._stop.set()
        self._thread.join(timeout=5)
        for _intf, sock in self.socks.values():
            sock.close()

    def _loop(self) -> None:
        poller = select.epoll()
        for fd in self.socks:
            poller.register(fd, select.EPOLLIN)
        try:
            while not self._stop.is_set():
                for fd, _mask in poller.poll(0.02):
                    intf, sock = self.socks[fd]
                    self._drain(intf, sock)
        finally:
            poller.close()

    def _drain(self, intf: str, sock: socket.socket) -> None:
        head = bytearray(HEAD)
        while True:
            try:  # MSG_TRUNC: the frame's whole length comes back, its first HEAD bytes are kept
                length, ancillary, _flags, address = sock.recvmsg_into([head], socket.CMSG_SPACE(TIMESPEC.size),
                                                                       socket.MSG_TRUNC)
            except BlockingIOError:
                return
            at = time.time_ns()
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = TIMESPEC.unpack(payload[:TIMESPEC.size])
                    at = sec * 1_000_000_000 + nsec
            self.frames.append(Frame(at, intf, address[2] == PACKET_OUTGOING, length, bytes(head[:min(length, HEAD)])))

    def on(self, intf: str, outgoing: bool) -> list[Frame]:
        """The frames one interface sent (outgoing) or received, in time order."""
        return sorted((f for f in self.frames if f.intf == intf and f.outgoing == outgoing), key=lambda f: f.at_ns)

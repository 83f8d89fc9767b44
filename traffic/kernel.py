"""The system calls the agents need that Python 3.11's standard library lacks, through ctypes: a timerfd, a
socket filter, and (for traffic.netns) setns. Kept apart from the agents' hot path, which mypyc compiles (it does
not compile ctypes structures)."""

from __future__ import annotations

import ctypes
import os
import socket

SO_ATTACH_FILTER = 26
CLOCK_MONOTONIC = 1
TFD_NONBLOCK, TFD_CLOEXEC, TFD_TIMER_ABSTIME = os.O_NONBLOCK, os.O_CLOEXEC, 1
libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, call: str) -> int:
    """A libc call's result; an OSError with errno's message where it failed (a negative result)."""
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{call}: {os.strerror(err)}")
    return result


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class WakeTimer:
    """A timerfd set to an absolute CLOCK_MONOTONIC time, watched by the same epoll as the sockets: epoll's own
    timeout has millisecond resolution (Python rounds it up), too coarse for packet times of a millisecond."""

    def __init__(self) -> None:
        self.fd = check(libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC), "timerfd_create")
        self.spec = _Itimerspec()
        self.at = 0  # the time it is set to (0: disarmed)

    def set(self, at_ns: int) -> None:
        """Fire at `at_ns` (0 disarms); setting it also clears an expiry not yet read."""
        if at_ns == self.at:
            return
        self.spec.it_value.tv_sec, self.spec.it_value.tv_nsec = divmod(at_ns, 1_000_000_000)
        check(libc.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(self.spec), None), "timerfd_settime")
        self.at = at_ns

    def close(self) -> None:
        os.close(self.fd)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33
FORCED = {socket.SO_SNDBUF: SO_SNDBUFFORCE, socket.SO_RCVBUF: SO_RCVBUFFORCE}


def socket_buffer(sock: socket.socket, option: int, size: int) -> None:
    """A socket's send or receive buffer at `size` whatever the machine's net.core.[rw]mem_max (as root: the
    limits are machine-wide, and a run must neither depend on nor raise them); capped by them otherwise."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, FORCED[option], size)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, option, size)


def drop_all_filter(sock: socket.socket) -> None:
    """Attach the classic BPF program `ret #0`: the socket receives nothing (it is only for sending)."""
    insns = (_SockFilter * 1)(_SockFilter(0x06, 0, 0, 0))
    prog = _SockFprog(1, insns)
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, bytes(ctypes.string_at(ctypes.addressof(prog),
                                                                             ctypes.sizeof(prog))))

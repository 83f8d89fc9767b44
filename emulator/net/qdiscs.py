"""Queue backlogs read over rtnetlink, one socket per network namespace, instead of running `tc -s qdisc show`.

The queue exporter polls every 100 ms, and with a namespace per plane a `tc` process per namespace and poll
would cost a good part of a core; a netlink dump is two system calls. A netlink socket stays in the namespace
it was opened in, so each is opened once, inside its namespace.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Sequence

from emulator.net import shaping
from traffic.netns import entered

RTM_NEWQDISC, RTM_GETQDISC = 36, 38
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
TCA_KIND, TCA_STATS2, TCA_STATS_APP, TCA_STATS_QUEUE = 1, 7, 4, 3
HEADER = struct.Struct("=IHHII")   # nlmsghdr: length, type, flags, sequence, port
TCMSG = struct.Struct("=BxxxiIII")  # tcmsg: family, ifindex, handle, parent, info
ATTR = struct.Struct("=HH")        # rtattr: length, type
QUEUE = struct.Struct("=IIIII")    # gnet_stats_queue: qlen, backlog, drops, requeues, overlimits
RED_XSTATS = struct.Struct("=IIII")  # tc_red_xstats: early, pdrop, other, marked
ROOT_MAJOR = int(shaping.ROOT.rstrip(":"), 16)  # the queues are right under our shaper's HTB root


def attributes(data: bytes, offset: int, end: int):
    """(type, value) of each rtattr between offset and end."""
    while offset + ATTR.size <= end:
        length, kind = ATTR.unpack_from(data, offset)
        if length < ATTR.size:
            return
        yield kind, data[offset + ATTR.size:offset + length]
        offset += (length + 3) & ~3


def messages(data: bytes, kind: int, what: str) -> tuple[list[tuple[int, int]], bool]:
    """(where the body starts, where it ends) of each message of `kind` in a netlink dump's reply, and whether the
    dump ended; an error message raises OSError naming `what`."""
    out, offset = [], 0
    while offset + HEADER.size <= len(data):
        length, got, _flags, _seq, _port = HEADER.unpack_from(data, offset)
        if got == NLMSG_DONE:
            return out, True
        if got == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", data, offset + HEADER.size)
            if code:
                raise OSError(-code, f"{what}: {socket.errno.errorcode.get(-code, code)}")
        elif got == kind:
            out.append((offset + HEADER.size, offset + length))
        offset += (length + 3) & ~3
    return out, False


def parse_dump(data: bytes) -> tuple[list[tuple[int, int, int, int, int]], bool]:
    """(ifindex, parent handle, backlog bytes, packets dropped, packets RED marked (0 for other kinds)) of every
    qdisc in netlink messages, and whether the dump ended."""
    found, done = messages(data, RTM_NEWQDISC, "qdisc dump")
    out = []
    for start, end in found:
        _family, ifindex, _handle, parent, _info = TCMSG.unpack_from(data, start)
        backlog = drops = marked = 0
        kind, app = b"", b""
        for attr, value in attributes(data, start + TCMSG.size, end):
            if attr == TCA_KIND:
                kind = value.rstrip(b"\0")
            elif attr == TCA_STATS2:
                for inner, stats in attributes(value, 0, len(value)):
                    if inner == TCA_STATS_QUEUE:
                        _qlen, backlog, drops, _requeues, _overlimits = QUEUE.unpack_from(stats)
                    elif inner == TCA_STATS_APP:
                        app = stats
        if kind == b"red" and len(app) >= RED_XSTATS.size:
            marked = RED_XSTATS.unpack_from(app)[3]
        out.append((ifindex, parent, backlog, drops, marked))
    return out, done


class QdiscReader:
    """Backlogs of the shaper's queues in a set of namespaces (paths; None is the root namespace)."""

    def __init__(self, namespaces: Sequence[str | None] = (None,)) -> None:
        self.sockets: dict[str | None, socket.socket] = {}
        self.names: dict[str | None, dict[int, str]] = {}
        for ns in namespaces:
            with entered(ns):
                self.sockets[ns] = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
                self.names[ns] = dict(socket.if_nameindex())
        self.sequence = 0

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close()

    def _name(self, ns: str | None, ifindex: int) -> str | None:
        if ifindex not in self.names[ns]:
            with entered(ns):
                self.names[ns] = dict(socket.if_nameindex())
        return self.names[ns].get(ifindex)

    def _dump(self, ns: str | None) -> list[tuple[int, int, int, int, int]]:
        self.sequence += 1
        sock = self.sockets[ns]
        sock.send(HEADER.pack(HEADER.size + TCMSG.size, RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, self.sequence, 0)
                  + TCMSG.pack(0, 0, 0, 0, 0))
        found: list[tuple[int, int, int, int, int]] = []
        done = False
        while not done:
            part, done = parse_dump(sock.recv(1 << 16))
            found += part
        return found

    def leaf_backlogs(self) -> dict[str, dict[str, int]]:
        """Bytes waiting in each queue (a qdisc right under one of our HTB classes), by interface and class, as
        emulator.net.shaping.leaf_backlogs reads them from tc."""
        out: dict[str, dict[str, int]] = {}
        for ns in self.sockets:
            for ifindex, parent, backlog, _drops, _marked in self._dump(ns):
                if parent >> 16 == ROOT_MAJOR:
                    name = self._name(ns, ifindex)
                    if name is not None:
                        out.setdefault(name, {})[f"{parent >> 16:x}:{parent & 0xFFFF:x}"] = backlog
        return out

    def _summed(self, pick: Callable[[int, int, int], int | None]) -> dict[str, int]:
        """Per interface, the sum over its qdiscs of pick(parent, drops, marked); None leaves a qdisc out."""
        out: dict[str, int] = {}
        for ns in self.sockets:
            for ifindex, parent, _backlog, drops, marked in self._dump(ns):
                n = pick(parent, drops, marked)
                name = self._name(ns, ifindex) if n is not None else None
                if n is not None and name is not None:
                    out[name] = out.get(name, 0) + n
        return out

    def drops(self) -> dict[str, int]:
        """Packets each interface's queues dropped (the frames that wake a paused gate, dropped on purpose by
        their class, are not counted: emulator.net.shaping.KICK_CLASS)."""
        kick = int(shaping.KICK_CLASS.split(":")[1], 16)
        return self._summed(lambda parent, drops, _marked:
                            drops if parent >> 16 == ROOT_MAJOR and parent & 0xFFFF != kick else None)

    def red_marks(self) -> dict[str, int]:
        """Packets RED marked CE, per interface (its own statistics; RED under netem included)."""
        return self._summed(lambda _parent, _drops, marked: marked or None)

    def backlogs(self) -> dict[str, int]:
        """Bytes waiting per interface, summed over its queues."""
        return {intf: sum(queues.values()) for intf, queues in self.leaf_backlogs().items()}

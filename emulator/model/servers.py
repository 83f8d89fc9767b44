"""The servers of a cluster run (`--servers`, `servers = [...]`): who they are, and how far apart their clocks are;
and an external controller's address (`--controller tcp:HOST:PORT`).

A server is named as ssh names it, `[user@]host[:port]`; `localhost` is this machine. Names are checked here,
once, so nothing later passes a user's text where a shell or ssh option could read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from emulator.model.errors import UserError

LOCAL = "localhost"
_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]+\]")


@dataclass(frozen=True)
class Server:
    host: str
    user: str | None = None
    port: int = 22

    @property
    def local(self) -> bool:
        return self.host == LOCAL

    @property
    def target(self) -> str:
        """ssh's destination argument: [user@]host."""
        return f"{self.user}@{self.host}" if self.user else self.host

    def __str__(self) -> str:
        return self.target + (f":{self.port}" if self.port != 22 else "")


def parse_server(text: str, field: str = "servers") -> Server:
    """`[user@]host[:port]`, or a UserError naming `field`."""
    user, _, rest = text.strip().rpartition("@")
    host, port = rest, "22"
    if rest.startswith("["):  # [IPv6]:port
        host, _, tail = rest.partition("]")
        host += "]"
        if tail:
            if not tail.startswith(":"):
                raise UserError(f"{text!r} is not [user@]host[:port]", field=field)
            port = tail[1:]
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    if user and not _USER.fullmatch(user):
        raise UserError(f"{text!r}: {user!r} is not a user name", field=field)
    if not _HOST.fullmatch(host):
        raise UserError(f"{text!r}: {host!r} is not a host name or address", field=field)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{text!r}: port {port!r} is not 1-65535", field=field)
    return Server(host=host, user=user or None, port=int(port))


def parse_servers(items: str | list[str], field: str = "servers") -> list[Server]:
    """A comma-separated list (the command line) or a list (a scenario) of distinct servers."""
    texts = items.split(",") if isinstance(items, str) else list(items)
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise UserError("give one or more servers as [user@]host[:port]", field=field)
    servers = [parse_server(t, field) for t in texts]
    seen = set()
    for server in servers:
        if (server.host, server.port) in seen:
            raise UserError(f"{server} is listed twice", field=field)
        seen.add((server.host, server.port))
    return servers


@dataclass(frozen=True)
class ClockSample:
    """One exchange: our clock when we asked, the server's when it answered, ours when the answer came."""

    sent_ns: int
    remote_ns: int
    received_ns: int

    @property
    def round_trip_ns(self) -> int:
        return self.received_ns - self.sent_ns


@dataclass(frozen=True)
class ClockOffset:
    """A server's clock less ours, and how sure: the exchange it comes from took `round_trip_ns`, so the
    offset is right within half of that."""

    offset_ns: int
    round_trip_ns: int
    realtime_ns: int = 0  # the server's CLOCK_REALTIME less ours (packet captures' time stamps)
    taken_ns: int = 0  # our CLOCK_MONOTONIC halfway through the exchange it comes from

    def to_local(self, remote_ns: int) -> int:
        return remote_ns - self.offset_ns

    def to_remote(self, local_ns: int) -> int:
        return local_ns + self.offset_ns


def estimate_offset(samples: list[ClockSample]) -> ClockOffset:
    """Cristian's estimate from the fastest exchange: the server read its clock halfway through it, within
    half its round trip; slower exchanges only add queueing on one leg or the other."""
    if not samples:
        raise ValueError("no clock samples")
    best = min(samples, key=lambda s: s.round_trip_ns)
    return ClockOffset(offset_ns=best.remote_ns - (best.sent_ns + best.received_ns) // 2,
                       round_trip_ns=best.round_trip_ns, taken_ns=(best.sent_ns + best.received_ns) // 2)


@dataclass(frozen=True)
class ClockDrift:
    """How far a server's clock moved against ours between two estimates (a virtual machine's clock drifts: a
    time measured there and turned into ours with the first offset is off by up to `moved_ns` by the second)."""

    moved_ns: int
    over_s: float
    uncertain_ns: int  # half of each estimate's round trip, summed

    @property
    def ppm(self) -> float:
        return self.moved_ns / (self.over_s * 1e3) if self.over_s > 0 else 0.0


def drift(before: ClockOffset, after: ClockOffset) -> ClockDrift:
    return ClockDrift(moved_ns=after.offset_ns - before.offset_ns, over_s=(after.taken_ns - before.taken_ns) / 1e9,
                      uncertain_ns=(before.round_trip_ns + after.round_trip_ns) // 2)


def external_target(text: str) -> tuple[str, int]:
    """(host, port) of an external controller given as tcp:HOST:PORT (one line naming the field if not)."""
    scheme, _, rest = text.partition(":")
    host, _, port = rest.rpartition(":")
    if scheme != "tcp" or not host or not port.isdigit() or not 0 < int(port) < 65536 or \
            not all(c.isalnum() or c in ".-_" for c in host):
        raise UserError(f"must be tcp:HOST:PORT, got {text!r}", field="controller")
    return host, int(port)

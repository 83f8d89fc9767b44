"""A small UDP sender and sink run inside emulated hosts, for checking where flows go.

    python -m traffic.udpprobe send --dst 10.0.0.9 --flows 64 --packets 20
    python -m traffic.udpprobe sink --seconds 5

Flow f uses source port BASE_SPORT + f, so an ECMP hash sees `flows` distinct 5-tuples; `--entropy K` steps
each flow's source port through K values, one per packet (per-packet entropy, what packet spraying needs:
flow f's packet i leaves from BASE_SPORT + f * K + i mod K). The sink counts what arrives (and keeps the
kernel from answering with ICMP port-unreachable).
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import struct
import sys
import time
from collections.abc import Callable

from traffic.kernel import socket_buffer

BASE_SPORT = 20000
DPORT = 9000
SINK_BUFFER = 16 << 20  # bytes of receive buffer: a few seconds of the probe's datagrams (each costs a page or more)
IDLE_S = 2.0  # a sink expecting more stops this long after the last arrival: the sender is done, the rest were lost
LISTENING = {"listening": DPORT}  # the sink's first line, once its socket is bound
HEADER = struct.Struct("!Q")  # a sequence number at the start of every payload, so the sink can find losses


def send(dst: str, flows: int, packets: int, size: int, entropy: int, rate_pps: float) -> dict:
    payload = bytearray(max(size, HEADER.size))
    socks = []
    for port in range(BASE_SPORT, BASE_SPORT + flows * entropy):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        socks.append(s)
    gap = 1.0 / rate_pps if rate_pps > 0 else 0.0
    sent = 0
    next_t = time.monotonic()
    for i in range(packets * flows):
        flow, seq = divmod(i, packets)
        sock = socks[flow * entropy + seq % entropy]
        HEADER.pack_into(payload, 0, i)
        sock.sendto(payload, (dst, DPORT))
        sent += 1
        if gap:
            next_t += gap
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    for s in socks:
        s.close()
    return {"sent": sent}


def sink(seconds: float, expect: int = 0, listening: Callable[[], None] | None = None) -> dict:
    """Count what arrives for `seconds`; told to `expect` n packets, until they have come or nothing more has for
    IDLE_S after the last (a sender that starts late, as a slow VM's interpreter does, is not cut short, and one
    whose packets were partly lost does not hold the sink to its deadline). `listening` is called once the socket
    is bound: a sender started after it loses nothing to a sink not yet there. With the senders' sequence numbers,
    also which packets never came."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    socket_buffer(s, socket.SO_RCVBUF, SINK_BUFFER)  # a sink descheduled a while (a slow VM) drops nothing
    s.bind(("0.0.0.0", DPORT))
    s.settimeout(0.2)
    if listening:
        listening()
    received, nbytes, sources = 0, 0, set()
    seqs: dict[str, set[int]] = {}
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline and not (expect and received >= expect):
        if expect and last is not None and time.monotonic() - last > IDLE_S:
            break
        try:
            data, addr = s.recvfrom(65536)
        except TimeoutError:
            continue
        last = time.monotonic()
        received += 1
        nbytes += len(data)
        sources.add(addr[1])
        if len(data) >= HEADER.size:
            seqs.setdefault(addr[0], set()).add(HEADER.unpack_from(data)[0])
    missing = {src: sorted(set(range(max(got) + 1)) - got) for src, got in seqs.items()}
    return {"received": received, "bytes": nbytes, "source_ports": len(sources),
            "missing": {src: {"count": len(m), "first": m[0], "last": m[-1]} for src, m in missing.items() if m}}


def argv(*args: str) -> list[str]:
    """This tool's command with the current interpreter, for popen in a Mininet host."""
    return [sys.executable, "-m", "traffic.udpprobe", *args]


def command(*args: str) -> str:
    """The same as one shell line, for a Mininet host's shell."""
    return shlex.join(argv(*args))


def last_json(output: str) -> dict:
    """The JSON result a run of this tool printed last (a host shell may print other lines first)."""
    return json.loads(output.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m traffic.udpprobe", description=__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("send")
    p.add_argument("--dst", required=True)
    p.add_argument("--flows", type=int, default=1)
    p.add_argument("--packets", type=int, default=10, help="packets per flow")
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--entropy", type=int, default=1, help="source ports each flow steps through, one per packet")
    p.add_argument("--rate", type=float, default=2000.0, help="packets per second (0: as fast as possible)")
    p = sub.add_parser("sink")
    p.add_argument("--seconds", type=float, default=5.0, help="the most to wait")
    p.add_argument("--expect", type=int, default=0, help="stop once this many packets have arrived, or nothing "
                   f"more has for {IDLE_S:g} s (0: wait)")
    args = parser.parse_args(argv)
    if args.mode == "send":
        result = send(args.dst, args.flows, args.packets, args.size, args.entropy, args.rate)
    else:
        result = sink(args.seconds, args.expect, listening=lambda: print(json.dumps(LISTENING), flush=True))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

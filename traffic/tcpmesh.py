"""TCP all-to-all from one process per host: a flow to every peer, goodput counted by the receiver.

One iperf3 process pair per flow does not scale to an all-to-all (32 hosts make 992 flows, 1,984 processes,
and the machine spends itself on them); this runs one process per host with one socket per peer and an
event loop. All hosts connect first, then send from a common start time (`--start-at`, wall clock: the hosts
share the machine's clock) for `--seconds`; the receiver counts bytes per source address inside the window.

    python -m traffic.tcpmesh --port 5201 --peers 10.0.0.2,10.0.0.3 --start-at 1795948981.5 --seconds 8
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import sys
import time

CHUNK = bytes(65536)
RECV_BUFFER = bytearray(1 << 18)


def _connect(peers: list[str], port: int, deadline: float, congestion: str | None) -> dict[str, socket.socket]:
    """Connect to every peer, retrying until the deadline (their listeners start at about the same time)."""
    conns: dict[str, socket.socket] = {}
    while len(conns) < len(peers) and time.time() < deadline:
        for peer in peers:
            if peer in conns:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if congestion:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion.encode())
            s.settimeout(max(0.1, min(2.0, deadline - time.time())))
            try:
                s.connect((peer, port))
            except OSError:
                s.close()
                continue
            s.setblocking(False)
            conns[peer] = s
        if len(conns) < len(peers):
            time.sleep(0.05)
    return conns


def mesh(port: int, peers: list[str], start_at: float, seconds: float, congestion: str | None,
        connect_s: float = 15.0) -> dict:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(len(peers) + 8)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    received: dict[str, int] = {p: 0 for p in peers}
    sent: dict[str, int] = {p: 0 for p in peers}

    outbound = _connect(peers, port, time.time() + connect_s, congestion)
    end = start_at + seconds
    for peer, s in outbound.items():
        sel.register(s, selectors.EVENT_WRITE, ("send", peer))
    inbound = 0
    while time.time() < end + 0.5:
        now = time.time()
        for key, _mask in sel.select(timeout=0.05):
            if key.data == "accept":
                try:
                    conn, addr = listener.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ, ("recv", addr[0]))
                inbound += 1
            elif key.data[0] == "recv":
                try:
                    count = key.fileobj.recv_into(RECV_BUFFER)
                except (BlockingIOError, ConnectionError):
                    continue
                if start_at <= now < end:
                    received[key.data[1]] = received.get(key.data[1], 0) + count
                if not count:
                    sel.unregister(key.fileobj)
            elif now >= end:  # done sending: stop waking up for a writable socket
                sel.unregister(key.fileobj)
            elif now >= start_at:
                try:
                    sent[key.data[1]] += key.fileobj.send(CHUNK)
                except (BlockingIOError, ConnectionError):
                    pass
        if now < start_at:
            time.sleep(min(0.01, start_at - now))
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    for s in outbound.values():
        s.close()  # closing twice is harmless
    return {"received": received, "sent": sent, "seconds": seconds, "inbound": inbound,
            "connected": sorted(outbound), "unreachable": sorted(set(peers) - set(outbound))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m traffic.tcpmesh", description=__doc__)
    parser.add_argument("--port", type=int, default=5201)
    parser.add_argument("--peers", required=True, help="comma-separated peer addresses")
    parser.add_argument("--start-at", type=float, required=True, help="wall-clock start of the window")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--cc", help="TCP congestion control (default: the kernel's)")
    parser.add_argument("--out", help="write the JSON result here instead of stdout")
    args = parser.parse_args(argv)
    result = mesh(args.port, [p for p in args.peers.split(",") if p], args.start_at, args.seconds, args.cc)
    text = json.dumps(result)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

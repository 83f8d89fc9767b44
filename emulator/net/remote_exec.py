"""The server's end of a remote command (emulator.net.remote): ssh runs this fixed command line, and the command
to run comes as one JSON line on standard input, so no shell on the server ever reads a name of ours. The rest
of standard input is the command's own.

Header: {"argv": [...]} runs argv (execvp, so exit status and output are the command's); {"clock": true}
answers each byte read with this server's CLOCK_MONOTONIC in ns and how far its CLOCK_REALTIME is ahead of
that, one line each, until end of input.
Standard library only: it runs before anything else of ours is known to work there.
"""

from __future__ import annotations

import json
import os
import sys
import time

MAX_HEADER = 1 << 20


def read_header() -> dict:
    """The first line of standard input, read a byte at a time so that nothing after it is consumed."""
    line = bytearray()
    while len(line) < MAX_HEADER:
        byte = os.read(0, 1)
        if not byte or byte == b"\n":
            break
        line += byte
    return json.loads(line)


def serve_clock() -> None:
    while os.read(0, 1):
        now = time.monotonic_ns()
        os.write(1, b"%d %d\n" % (now, time.time_ns() - now))


def main() -> int:
    try:
        header = read_header()
    except ValueError as exc:
        print(f"remote_exec: bad header: {exc}", file=sys.stderr)
        return 2
    if header.get("clock"):
        serve_clock()
        return 0
    argv = header.get("argv")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        print("remote_exec: header has no argv list", file=sys.stderr)
        return 2
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"remote_exec: {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())

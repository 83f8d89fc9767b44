"""A server's switch queues for the controller on another (emulator.net.cluster starts it over ssh): every
interval, one JSON line of the named switches' egress backlogs on standard output, in QueueExporter's form,
until standard input ends. A cluster run's switches all sit in the server's root namespace (its own OVS)."""

from __future__ import annotations

import argparse
import json
import select
import sys

from emulator.net.monitor import QueueExporter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulator.net.queue_feed", description=__doc__)
    parser.add_argument("--switches", required=True, help="comma-separated")
    parser.add_argument("--interval", type=float, default=0.1)
    args = parser.parse_args(argv)
    exporter = QueueExporter(None, set(args.switches.split(",")), interval=args.interval)
    try:
        while not select.select([sys.stdin], [], [], args.interval)[0]:  # input ends: readable, and we stop
            sys.stdout.write(json.dumps(exporter.snapshot()) + "\n")
            sys.stdout.flush()
    except BrokenPipeError:
        pass
    finally:
        exporter.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

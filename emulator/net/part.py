"""A server's part of a fabric spread over several servers (emulator.net.cluster starts it over ssh).

Standard input: one JSON line (the whole model, this server's nodes, its tunnel ends, the controller's address
on this server's loopback), then host commands, a JSON line each: {"host", "send": line} starts one and
{"host", "wait": true} waits for its output, as Mininet's sendCmd and waitOutput. Standard output: {"up": {...}}
once the part is up, then {"out": ...} for each command; {"error": ...} if something fails. At the end of
standard input the part is torn down, as any run is.
"""

from __future__ import annotations

import json
import sys

from emulator.model.errors import UserError
from emulator.model.fabric import Fabric
from emulator.model.placement import TunnelEnd
from emulator.net.emulation import Emulation


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> int:
    header = json.loads(sys.stdin.readline())
    model = Fabric.from_dict(header["model"])
    part = (header["nodes"], tuple(TunnelEnd(**t) for t in header["tunnels"]))
    try:
        with Emulation(model, app=None, controller=header["controller"], shape=header["shape"], quiet=True,
                       part=part) as emu:
            _reply({"up": {"run": emu.state.run_id, **emu.timings}})
            for line in sys.stdin:
                request = json.loads(line)
                host = emu.host(request["host"])
                if "send" in request:
                    host.sendCmd(request["send"])
                _reply({"out": host.waitOutput() if request.get("wait") else ""})
    except UserError as exc:
        _reply({"error": str(exc)})
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

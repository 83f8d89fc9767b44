"""A server's part of a cluster run (emulator.net.cluster starts it over ssh).

Standard input: one JSON line (the whole model, this server's nodes, its tunnel ends, the controller's address
on this server's loopback), then requests, a JSON line each: {"host", "send": line} starts a command in a host
and {"host", "wait": true} waits for its output, as Mininet's sendCmd and waitOutput; {"agents": ...} drives
the transport agents of this server's hosts (emulator.run.launch.RemoteLauncher is the other end);
{"capture": {"interfaces", "snaplen"}} and {"capture_stop": true} capture some of its interfaces
(emulator.net.cluster); {"fault": [name, args...]} cuts, degrades or restores its links (Emulation's faults).
Standard output: {"up": {...}} once the part is up, then {"out": ...} for each request; {"error": ...} if something
fails. At the end of standard input the part is torn down, as any run is.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace

from emulator.model.capture import CaptureOptions
from emulator.model.errors import InternalError, UserError
from emulator.model.fabric import Fabric
from emulator.model.placement import TunnelEnd
from emulator.model.records import from_dict
from emulator.net.capture import Capture
from emulator.net.cluster_run import PartEmulation
from emulator.net.emulation import Emulation
from emulator.run.launch import AgentsStart, LocalLauncher
from emulator.run.server_monitors import ServerMonitors

FAULTS = ("fail_link", "fail_switch", "degrade_link", "restore")


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class Service:
    """What the run asks of a part besides host commands: its agents, its faults and its captures."""

    def __init__(self, emu: Emulation) -> None:
        self.emu = emu
        self.agents: LocalLauncher | None = None
        self.monitors: ServerMonitors | None = None
        self.capture: Capture | None = None

    def __call__(self, request: dict) -> dict:
        if "agents" in request:
            return self.drive_agents(request["agents"])
        if "fault" in request:  # on this server's links, as the run's Emulation asks (the model is the run's)
            name, *args = request["fault"]
            if name not in FAULTS:
                raise ValueError(f"no fault {name!r} here")
            getattr(self.emu, name)(*args)
            return {}
        if "capture" in request:
            wanted = request["capture"]
            self.capture = self.emu.start_capture(CaptureOptions(tuple(wanted["interfaces"]), wanted["snaplen"]),
                                                  self.emu.directory / "pcap")
            return {}
        said, self.capture = self.capture.stop(), None  # capture_stop
        return {intf: {**s, "path": str(self.emu.directory / "pcap" / s["file"])} for intf, s in said.items()}

    def drive_agents(self, request: dict) -> dict:
        """start (in this run's directory), status, go (the monitors start too), stop (with their report)."""
        if "start" in request:
            start = from_dict(AgentsStart, request["start"])
            outdir = self.emu.directory / "traffic"
            outdir.mkdir(exist_ok=True)
            (outdir / "schedule.jsonl").write_text(start.schedule)
            self.agents = LocalLauncher(self.emu, start.hosts, start.peers, outdir, start.run)
            self.monitors = ServerMonitors(self.emu)
            self.agents.start()
            return {}
        assert self.agents is not None, "agents: start first"
        if "status" in request:
            missing, ended = self.agents.status(request["status"])
            return {"missing": missing, "ended": ended}
        if "go" in request:
            self.agents.go(int(request["go"]))
            self.monitors.start()
            return {}
        out = replace(self.agents.stop(), server=self.monitors.stop())
        self.agents = self.monitors = None
        return asdict(out)


def main() -> int:
    header = json.loads(sys.stdin.readline())
    model = Fabric.from_dict(header["model"])
    tunnels = tuple(TunnelEnd(**t) for t in header["tunnels"])
    try:
        with PartEmulation(model, header["nodes"], tunnels, app=None, controller=header["controller"],
                           shape=header["shape"], quiet=True) as emu:
            service = Service(emu)
            _reply({"up": {"run": emu.state.run_id, **emu.timings}})
            for line in sys.stdin:
                request = json.loads(line)
                if "host" not in request:
                    try:
                        _reply({"out": json.dumps(service(request))})
                    except Exception as exc:  # noqa: BLE001 - said to the run, which decides; the part stays up
                        _reply({"error": f"{next(iter(request))}: {exc}"})
                    continue
                host = emu.host(request["host"])
                if "send" in request:
                    host.sendCmd(request["send"])
                _reply({"out": host.waitOutput() if request.get("wait") else ""})
    except UserError as exc:
        _reply({"error": str(exc)})
        return 2
    except InternalError as exc:  # the run says it as its own, in one line
        _reply({"error": str(exc)})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

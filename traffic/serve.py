"""The transport agent process: serves several emulated hosts (traffic.rdma, one per host) from one event loop
(traffic.eventloop), each host's sockets opened in that host's network namespace, and writes what each measured:

    python -m traffic.serve --config RUN/agent.json --hosts n0g0,n0g1

The runner (emulator.run.launch) writes the config (the schedule file, host addresses, namespaces and link
rates, transport options), starts the agent processes, and starts them together: each binds its hosts'
sockets, writes `<host>.ready` for each, and waits for `go`. When all of a host's messages are acknowledged and
all messages it expects are delivered it writes `<host>.done` and keeps answering (a peer may still need an ACK)
until SIGTERM or the deadline; then it writes `<host>.json` for each host. Where the runner says so (the
environment variable traffic.hotpath.ENV), the hot path comes from the mypyc build instead of the source.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from emulator.model.schedule import read
from emulator.model.stats import percentiles
from traffic import eventloop, hotpath, netns, rdma
from traffic.contract import AgentConfig, CpuTimes, HostResult, Sent


def common_result(agent) -> dict:
    """What every agent reports the same way, as HostResult's fields: its messages (sent: anything with
    posted_ns, first_tx_ns, acked_ns and retransmits), deliveries, RTT samples, timer lateness, and the CPU time of
    its process (which may serve other hosts too: `pid` tells processes apart)."""
    return {
        "host": agent.host, "t0_ns": agent.t0,
        "sent": {str(i): Sent(s.posted_ns, s.first_tx_ns, s.acked_ns, s.retransmits) for i, s in agent.sent.items()},
        "received": {str(i): d for i, d in agent.plan.delivered.items()},
        "expected": len(agent.plan.expected), "unexpected": agent.unexpected, "wrong_size": agent.plan.wrong_size,
        "rtt_us": agent.rtt.items, "rtt_seen": agent.rtt.seen,
        "timer_lateness_us": percentiles(agent.lateness.items), "pid": os.getpid(), "cpu_s": time.process_time(),
        "traffic_cpu_s": CpuTimes(**eventloop.cpu_since(agent.cpu_at_go)),
    }


def parse_args(argv: list[str] | None, prog: str) -> tuple[AgentConfig, list[str]]:
    """The run's agent config and the hosts this process serves."""
    parser = argparse.ArgumentParser(prog=prog, description="The transport agent of the emulated hosts named.")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--hosts", "--host", required=True, help="comma-separated: the hosts this process serves")
    args = parser.parse_args(argv)
    return AgentConfig.read(args.config), args.hosts.split(",")


QUIET_S = 0.2  # after the last step, the receive sockets are read until nothing came for this long


def drain(agents: list[rdma.Agent], deadline_s: float = 3.0) -> None:
    """Count what still arrives once the loop has stopped (other agents' last ACKs and grants, packets still in
    the queues), until QUIET_S passed without any or `deadline_s`; what comes later finds the socket closed and
    the kernel counts it (UDP NoPorts: emulator.net.ledger)."""
    start = last = time.monotonic()
    while time.monotonic() - last < QUIET_S and time.monotonic() - start < deadline_s:
        if sum(a.drain() for a in agents):
            last = time.monotonic()
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    """Serve the given hosts from one event loop until all are done and stopped (SIGTERM) or the deadline; write
    each host's `<host>.json`. Each host's sockets are opened in that host's network namespace."""
    config, hosts = parse_args(argv, "python -m traffic.serve")
    messages = read(config.schedule)
    agents = [rdma.Agent(config, h, messages) for h in hosts]
    loop = eventloop.Loop(agents, slack_ns=min(a.slack_ns for a in agents))
    eventloop.on_stop_signals(lambda: setattr(loop, "stop", True))
    scheduling = eventloop.schedule(config.transport.agent_scheduling)
    for a in agents:
        with netns.entered(config.netns.get(a.host)):
            a.open()
    loop.run(Path(config.dir), config.ready_timeout_s, config.deadline_s)
    drain(agents)
    for a in agents:
        HostResult(**common_result(a), **a.result(), scheduling=scheduling, code=hotpath.loaded(rdma),
                   wakeups=loop.wakeups).write(Path(config.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())

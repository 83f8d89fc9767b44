"""`--link-mbps auto`: the highest link rate whose run this machine carries faithfully, predicted before bring-up
from the schedule and the machine's measured costs, and set beside the CPU the run really used afterwards.

At the rates a 64-GPU fabric fits into two cores the costs are per packet, not per byte:
- the agents pay for every datagram they send and receive (data, ACKs, pull's requests and grants) and for
  their timers, so much per agent per second; they run realtime, so they take what they need first;
- a userspace switch daemon wakes for packet-hops and polls every port it has on each wake-up (OVS's netdev-linux
  allocates a receive batch per port per poll: perf on the 64-GPU 8-plane fabric found half the daemon's CPU in
  malloc and free), so at sparse load a hop costs in proportion to its daemon's ports; with less CPU left by the
  agents it batches more per wake-up and takes a share (`daemon_yield`) of what they leave (measured on the
  64-GPU fabric, 1 to 12 Mbit/s: the shared daemon took 0.80 of a core beside agents at 0.26, 0.36 beside 1.06).
A run fits when it is predicted to need at most SHARE of the machine and its daemons' cost at sparse load (a
wake-up per hop) is at most PRESSURE times the cores they get, i.e. they need not batch more than that: past
either, the daemons fall behind, hold packets in their input where the model has no queue and lose some there
(measured, all-to-all under pull, 3 seeds each where given: 64 GPUs at 5 Mbit/s, predicted 66 % and pressure 8,
1.08x its bound and faithful; at 6 Mbit/s, 70 % and 11, 1.09-1.11x, one run of six UNFAITHFUL (0.13 % lost at the
daemons' input); at 7.5 and 8 Mbit/s, 75-77 % and 17-20, UNFAITHFUL; 128 GPUs at 5 Mbit/s, 69 % but pressure 14,
UNFAITHFUL 3 of 3 with 0.3-2.8 % lost at the daemons' input, and at 4 Mbit/s, pressure 9.9, still 3 of 3; and in the
whole suite, on a machine busy with more than the run, 64 GPUs at 5 Mbit/s (8.2) came out UNFAITHFUL in 2 of 3
runs; and in CI, with this machine's costs of today, 64 GPUs at 2.5 Mbit/s (predicted 65 %, pressure 5.6, used 75 %,
the machine 7 % idle at least) held packets 38 ms on average at the daemons' input, UNFAITHFUL; at 2 Mbit/s (pressure
3.9) 169-378 packets were lost at the daemons' input over three runs (one past 0.1 %: UNFAITHFUL), at 1.5 Mbit/s (2.6)
none in two: so PRESSURE keeps a margin below 3.9). The costs come from
`mpft doctor --measure` (two calibration runs on the 64-GPU 8-plane fabric, cached in costs_file()), or are built
in (this project's reference machine) until it has run.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from controllers.routing import shortest_path_routes
from emulator.analysis import bounds
from emulator.model import topologies, wire
from emulator.model.errors import EnvironmentProblem, UserError
from emulator.model.fabric import Fabric
from emulator.model.schedule import Message
from emulator.net import monitor, switchd
from emulator.run.job import run_job
from traffic import patterns

RATES = topologies.AUTO_RATES  # Mbit/s, the candidates
PULL_BASE = 3.0  # cc pull: a pulled packet, its ACK and its grant
SHARE = 0.72  # the most of the machine a run may be predicted to need (measured edge: see above)
PRESSURE = 3.0  # the most the daemons may cost at sparse load over the cores they get (measured edge: see above)
OTHER_WORK = 0.25  # cores: other work on the machine below this is noise, not a smaller machine


def costs_file() -> Path:
    return Path(os.environ.get("MPFT_COSTS") or Path.home() / ".cache" / "mpft" / "costs.json")


@dataclass(frozen=True)
class Costs:
    """What the machine pays for a run, in CPU seconds."""

    agent_s_per_datagram: float       # to send a datagram and to receive it
    agent_s_per_agent_second: float   # an agent's timers and polling, per second it runs
    switch_s_per_hop_port: float      # one packet-hop through a daemon at sparse load, per port that daemon polls
    daemon_yield: float               # the share of the cores the agents leave that the daemons take, at most
    pull_datagrams_per_packet: float  # cc pull: datagrams (data, ACK, requests, grants) per data packet a NIC sends
    cores: float = 0                  # the cores the run may have (0: os.cpu_count(); fewer: with_free_cores)
    source: str = "built in"          # or when `mpft doctor --measure` measured them
    pull_fan_in: float = 56.0         # the senders each receiver's NIC served when pull's figure was measured

    def machine_cores(self) -> float:
        return self.cores or os.cpu_count() or 1

    def with_free_cores(self, seconds: float = 1.0) -> Costs:
        """These costs for the cores other work leaves the run now (the machine's idle share over `seconds`, one
        core at least), where it uses at least OTHER_WORK of a core. Other work at a lower priority yields the run
        most of a core it wants, not all: beside a one-core busy loop, the 64-GPU all-to-all at the rate two
        cores fit had a daemon's input hold packets 7 packet times (UNFAITHFUL), and an agent at 95 % of a core."""
        machine = os.cpu_count() or 1
        free = machine * monitor.idle_share(seconds)
        return replace(self, cores=max(1.0, round(free, 2))) if free < machine - OTHER_WORK else self

    def pulled(self, fan_in: int) -> float:
        """Datagrams per pulled packet into a receiver whose NIC serves `fan_in` senders: the packet, its ACK and
        its grant, and the repeats: a receiver grants its senders in turn, a sender that waits long asks again and
        each repeat is answered with its grant total, so repeats grow with the senders served (measured, seed 1:
        an all-to-all of 64 GPUs, fan-in 56, 108 k requests and 153 k grants for 108 k pulled packets; a
        permutation, fan-in 1, 193 and 13.6 k for 15.1 k)."""
        return PULL_BASE + max(0.0, self.pull_datagrams_per_packet - PULL_BASE) * fan_in / self.pull_fan_in


# The reference machine (2 cores, kernel 6.18, OVS 3.1), `mpft doctor --measure` on 2026-12-07 (pull asking again
# after two turns: 3.4 datagrams per pulled packet at fan-in 56, was 4.2).
BUILT_IN = Costs(agent_s_per_datagram=32e-6, agent_s_per_agent_second=1.0e-3, switch_s_per_hop_port=1.13e-6,
                 daemon_yield=0.46, pull_datagrams_per_packet=3.4)


def load_costs(path: Path | None = None) -> Costs:
    """The measured costs if `mpft doctor --measure` has run here (and its file is readable), else BUILT_IN."""
    path = path or costs_file()
    try:
        return Costs(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return BUILT_IN


def save_costs(costs: Costs, path: Path | None = None) -> Path:
    path = path or costs_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(costs), indent=2) + "\n")
    return path


@dataclass(frozen=True)
class Load:
    """What a schedule asks of the machine whatever the rate: datagrams, packet-hops through each switch, agents."""

    data_packets: int
    datagrams: float
    hops: dict[str, float]
    agents: int


def inside_node(fabric: Fabric, src: str, dst: str) -> bool:
    """Whether src reaches dst over its node's NVLink alone: no NIC on the way, so cc pull does not pace it (a data
    packet and its ACK, without requests or grants)."""
    domain = fabric.nvlink_peer(src)
    return domain is not None and domain == fabric.nvlink_peer(dst)


def nic_pairs(fabric: Fabric, pairs) -> set[tuple[str, str]]:
    """The (src, dst) pairs whose packets cross a NIC, which cc pull paces (the rest go over NVLink alone)."""
    return {(src, dst) for src, dst in pairs if not inside_node(fabric, src, dst)}


def data_packets(fabric: Fabric, m: Message) -> int:
    return max(1, math.ceil(m.bytes / wire.payload_per_packet(fabric.mtu)))


def load_of(fabric: Fabric, messages: list[Message], cc: str, costs: Costs) -> Load:
    """Every data packet crosses the switches of its path; the ACKs and pull's control datagrams it causes cross
    those of the way back (across planes, another plane's)."""
    per_pair: Counter[tuple[str, str]] = Counter()
    for m in messages:
        per_pair[(m.src, m.dst)] += data_packets(fabric, m)
    routes = shortest_path_routes(fabric)
    switches = set(fabric.switches())
    hops: Counter[str] = Counter()
    datagrams = 0.0
    nic = nic_pairs(fabric, per_pair)
    fan_in = Counter(dst for _, dst in nic)
    for (src, dst), packets in per_pair.items():
        per_packet = costs.pulled(fan_in[dst]) if cc == "pull" and (src, dst) in nic else 2.0
        datagrams += packets * per_packet
        for way, count in (((src, dst), packets), ((dst, src), packets * (per_packet - 1))):
            for (a, _b), frac in bounds.flow_links(fabric, *way, routes=routes).items():
                if a in switches:
                    hops[a] += frac * count
    agents = len({m.src for m in messages} | {m.dst for m in messages})
    return Load(sum(per_pair.values()), datagrams, dict(hops), agents)


@dataclass(frozen=True)
class Prediction:
    """The CPU a run at `mbps` is predicted to need, in cores."""

    mbps: float
    seconds: float      # how long the run should last at this rate (bounds.in_sequence_s): the load's spread
    agents: float
    switches: float
    machine: float      # the cores the run may have (the machine's, less other work's: Costs.with_free_cores)
    source: str
    pressure: float = 0.0  # the daemons' cost at sparse load (a wake-up per hop) over the cores they get

    @property
    def cores(self) -> float:
        return self.agents + self.switches

    def of_cores(self) -> str:
        """'2 cores', or the cores other work left free, said as such."""
        machine = os.cpu_count() or 1
        if self.machine < machine:
            return f"{self.machine:g} cores (other work is using the rest of {machine})"
        return f"{self.machine:g} cores"

    @property
    def share(self) -> float:
        return self.cores / self.machine

    def fits(self) -> bool:
        return self.share <= SHARE and self.pressure <= PRESSURE


def daemon_switches(fabric: Fabric, mode: str | None = None) -> list[list[str]]:
    """The switches each forwarding daemon serves, as the run will lay them out (emulator.net.switchd)."""
    return switchd.daemon_groups(fabric, switchd.resolve_mode(fabric, mode or switchd.default_mode()))


def predict(fabric: Fabric, messages: list[Message], load: Load, costs: Costs, mode: str | None = None,
            mbps: float = 0.0) -> Prediction:
    seconds = bounds.in_sequence_s(fabric, messages)
    agents = (costs.agent_s_per_datagram * load.datagrams / seconds
              + costs.agent_s_per_agent_second * load.agents)
    sparse = [sum(load.hops.get(s, 0.0) for s in group) / seconds * sum(len(fabric.graph[s]) for s in group)
              * costs.switch_s_per_hop_port for group in daemon_switches(fabric, mode)]
    need = sum(min(1.0, x) for x in sparse)  # each daemon's one forwarding thread takes at most a core
    available = costs.daemon_yield * max(0.0, costs.machine_cores() - agents)
    return Prediction(mbps, seconds, agents, min(need, available), costs.machine_cores(), costs.source,
                      sum(sparse) / available if available else math.inf)


def choose(build: Callable[[float], Fabric], messages: list[Message], cc: str, costs: Costs | None = None,
           mode: str | None = None) -> Prediction:
    """The highest of RATES whose run fits (Prediction.fits; the need and the pressure grow with the rate:
    bisect). None fits: UserError."""
    costs = costs or load_costs()
    load = load_of(build(RATES[0]), messages, cc, costs)

    def at(i: int) -> Prediction:
        return predict(build(RATES[i]), messages, load, costs, mode, RATES[i])

    lowest = at(0)
    if not lowest.fits():
        raise UserError(f"this traffic needs {lowest.cores:.2f} of {lowest.of_cores()} even at "
                        f"{RATES[0]} Mbit/s ({lowest.share:.0%}, at most {SHARE:.0%} fits; switch daemons' pressure "
                        f"{lowest.pressure:.1f}, at most {PRESSURE:g})", field="link_mbps")
    low, high = 0, len(RATES)  # RATES[low] fits, RATES[high] does not (or is past the end)
    best = lowest
    while high - low > 1:
        mid = (low + high) // 2
        p = at(mid)
        if p.fits():
            low, best = mid, p
        else:
            high = mid
    return best


def largest_fitting(variant: Callable[[int], tuple[Fabric, list[Message]]], start: int, cc: str,
                    costs: Costs | None = None, mode: str | None = None) -> Fabric | None:
    """The first of variant(start - 1), variant(start - 2), ... (e.g. fewer nodes) whose traffic fits at the
    lowest rate, or None; a variant that cannot be built (UserError: the nodes do not divide over the leaves)
    is passed over."""
    costs = costs or load_costs()
    for size in range(start - 1, 0, -1):
        try:
            fabric, messages = variant(size)
        except UserError:
            continue
        if predict(fabric, messages, load_of(fabric, messages, cc, costs), costs, mode).fits():
            return fabric
    return None


def as_record(p: Prediction) -> dict:
    """A prediction for run_job (its cpu_prediction) and traffic.json."""
    return {**asdict(p), "cores": p.cores, "share": p.share}


CALIBRATION = {"planes": 8, "nodes": 8, "leaves": 2, "spines": 2}  # the paper's fabric, 64 GPUs
CALIBRATION_RATES = (1.0, 6.0)  # Mbit/s: sparse (the daemon takes what it needs) and busy (it yields)


def measure_costs(outdir: Path, quiet: bool = True) -> Costs:
    """This machine's costs from a 64 KiB all-to-all on the 64-GPU 8-plane fabric at two rates (about two minutes):
    the agents' CPU per datagram and per agent-second solve two equations; a daemon's CPU per hop and port comes
    from the sparse run, its yield from the busy one."""
    runs = []
    for mbps in CALIBRATION_RATES:
        fabric = topologies.build("mpft", link_mbps=mbps, **CALIBRATION)
        messages = patterns.all_to_all(fabric, size=64 * 1024)
        m = run_job(fabric, messages, outdir / f"{mbps:g}", app="spray", quiet=quiet)
        if not m.completion_s or m.fidelity is None:
            raise EnvironmentProblem(f"the calibration run at {mbps:g} Mbit/s did not complete (see {outdir})")
        runs.append((fabric, messages, m))
    (f1, messages, m1), (_f2, _, m2) = runs
    cores = os.cpu_count() or 1
    n = len({x.src for x in messages} | {x.dst for x in messages})
    (t1, g1, a1), (t2, g2, a2) = ((m.completion_s, m.packets.datagrams_sent, m.fidelity.agents_cpu_s)
                                  for _, _, m in runs)
    det = n * t1 * g2 - n * t2 * g1
    per_second, per_datagram = (a1 * g2 - a2 * g1) / det, (n * t1 * a2 - n * t2 * a1) / det
    if per_second < 0 or per_datagram < 0:  # noise: all of it per datagram
        per_second, per_datagram = 0.0, (a1 + a2) / (g1 + g2)
    nic = nic_pairs(f1, {(x.src, x.dst) for x in messages})
    inside = sum(data_packets(f1, x) for x in messages if (x.src, x.dst) not in nic)
    per_packet = (g1 - 2 * inside) / max(1, m1.packets.data - inside)  # per pulled packet (through a NIC)
    fan_in = len(nic) / max(1, len({dst for _, dst in nic}))  # the same for every receiver of an all-to-all
    load = load_of(f1, messages, "pull", Costs(per_datagram, per_second, 0.0, 0.0, per_packet, pull_fan_in=fan_in))
    port_hops = sum(sum(load.hops.get(s, 0.0) for s in group) * sum(len(f1.graph[s]) for s in group)
                    for group in daemon_switches(f1, m1.fidelity.switch_daemons or None)) * g1 / load.datagrams / t1
    left = cores - a2 / t2  # what the agents left the daemons in the busy run
    return Costs(per_datagram, per_second, m1.fidelity.switches_cpu_s / t1 / port_hops,
                 min(1.0, m2.fidelity.switches_cpu_s / t2 / left) if left > 0 else 1.0, per_packet, cores,
                 f"measured {time.strftime('%Y-%m-%d %H:%M')}", fan_in)

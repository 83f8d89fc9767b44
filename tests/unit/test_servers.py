"""Unit tier: naming servers, estimating a server's clock offset from timed exchanges, placing planes, and a
cluster run's results and series brought to this machine's clock."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulator.model import topologies
from emulator.model.errors import UserError
from emulator.model.placement import partition, place_planes, tunnels
from emulator.model.servers import ClockSample, Server, drift, estimate_offset, parse_server, parse_servers
from emulator.net.cluster_run import emulation
from emulator.net.monitor import LinkSampler
from emulator.run.job import servers_verdict
from emulator.run.launch import to_local_clock
from emulator.run.metrics import ServerSamples, ServerSummary
from emulator.run.server_monitors import merge_samples
from traffic.contract import Delivery, HostResult, Sent


@pytest.mark.parametrize("text, server", [
    ("gpu-box2", Server("gpu-box2")),
    ("ops@10.1.2.3", Server("10.1.2.3", "ops")),
    ("ops@host.example.org:2222", Server("host.example.org", "ops", 2222)),
    ("[fd00::2]:2200", Server("[fd00::2]", None, 2200)),
    ("localhost", Server("localhost")),
])
def test_a_server_is_named_as_ssh_names_it(text, server):
    assert parse_server(text) == server
    assert str(parse_server(str(server))) == str(server)


@pytest.mark.parametrize("text, says", [
    ("-oProxyCommand=sh", "is not a host name"),  # would be an ssh option
    ("a;reboot", "is not a host name"),
    ("x y", "is not a host name"),
    ("Root$@host", "is not a user name"),
    ("host:0", "port '0' is not 1-65535"),
    ("host:ssh", "port 'ssh' is not 1-65535"),
])
def test_a_bad_server_is_one_clear_error_naming_the_field(text, says):
    with pytest.raises(UserError, match=says) as caught:
        parse_server(text, field="servers")
    assert str(caught.value).startswith("servers: ")


def test_a_list_of_servers_from_the_command_line_or_a_scenario():
    assert parse_servers("localhost,b") == parse_servers(["localhost", "b"]) == [Server("localhost"), Server("b")]
    assert parse_servers("localhost,b")[0].local
    with pytest.raises(UserError, match="b is listed twice"):
        parse_servers("b,root@b")
    with pytest.raises(UserError, match="one or more servers"):
        parse_servers("a,,b")


def test_the_offset_comes_from_the_fastest_exchange():
    # The server is 1 s ahead. The slow exchange's answer sat in a queue on the way back: taken at face value
    # it would put the server 40 ms behind where it is.
    samples = [ClockSample(0, 1_000_000_000 + 5_000_000, 90_000_000),
               ClockSample(100_000_000, 1_101_000_000, 102_000_000)]
    offset = estimate_offset(samples)
    assert offset.offset_ns == 1_000_000_000
    assert offset.round_trip_ns == 2_000_000
    assert offset.to_local(offset.to_remote(123)) == 123


def test_a_clock_that_runs_fast_drifts_by_what_it_gained_over_the_time_between_estimates():
    # The server's clock runs 100 ppm fast: 10 s later (ours) it is 1 ms further ahead.
    def exchange(at_ns: int, ahead_ns: int) -> list[ClockSample]:
        return [ClockSample(at_ns - 1_000, at_ns + ahead_ns, at_ns + 1_000)]
    before, after = estimate_offset(exchange(0, 5_000_000)), estimate_offset(exchange(10**10, 6_000_000))
    moved = drift(before, after)
    assert (moved.moved_ns, moved.over_s, moved.uncertain_ns) == (1_000_000, 10.0, 2_000)
    assert moved.ppm == pytest.approx(100.0)
    assert drift(before, before).ppm == 0.0


@given(st.integers(-10**12, 10**12), st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 10**7),
                                                        st.integers(0, 10**7)), min_size=1, max_size=20))
def test_the_estimate_is_within_half_the_best_round_trip(offset_ns, exchanges):
    """Whatever the legs' delays, the true offset is within half the chosen exchange's round trip."""
    samples = [ClockSample(start, start + out + offset_ns, start + out + back)
               for start, out, back in exchanges]
    estimate = estimate_offset(samples)
    assert abs(estimate.offset_ns - offset_ns) <= estimate.round_trip_ns // 2 + 1
    assert estimate.round_trip_ns == min(out + back for _, out, back in exchanges)



def test_planes_are_placed_in_even_blocks_and_each_server_runs_whole_planes():
    fabric = topologies.build(planes=8, nodes=4, leaves=1, spines=1)
    placement = place_planes(fabric, 3)
    assert placement == {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1, 6: 2, 7: 2}
    parts = partition(fabric, placement)
    assert [p.planes for p in parts] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert sorted(s for p in parts for s in p.switches) == sorted(fabric.switches())
    assert sorted(h for p in parts for h in p.hosts) == sorted(fabric.hosts())
    for part in parts:  # a server's hosts and switches are all on its planes
        assert {fabric.node(n)["plane"] for n in part.switches + part.hosts} == set(part.planes)
        assert part.domains == fabric.nvlink_domains()  # every node has a GPU on every server


def test_each_nvlink_domain_gets_a_tunnel_per_pair_of_servers_holding_its_gpus():
    fabric = topologies.build(planes=8, nodes=4, leaves=1, spines=1)
    found = tunnels(fabric, place_planes(fabric, 3))
    assert len(found) == 4 * 3
    assert {(t.a, t.b) for t in found if t.domain == "n2nv"} == {(0, 1), (0, 2), (1, 2)}
    assert len({t.vni for t in found}) == 4  # one id per domain, the same at every pair
    assert tunnels(fabric, place_planes(fabric, 1)) == []


def test_a_fabric_that_cannot_be_split_is_refused_naming_why():
    with pytest.raises(UserError, match="2 servers for 1 plane: a server runs whole planes"):
        place_planes(topologies.build("ft2", leaves=2, spines=2, hosts_per_leaf=2), 2)
    multiport = topologies.build(planes=2, nodes=2, leaves=1, spines=1, multiport=True)
    with pytest.raises(UserError, match="host n0g0 has NICs on planes of servers \\[0, 1\\]"):
        partition(multiport, place_planes(multiport, 2))


@pytest.mark.parametrize("kwargs, says", [
    ({"app": None}, "needs a controller: an app, or --controller"),
    ({"servers": ["localhost", "b", "c"]}, "3 servers for 2 planes"),
    ({"servers": ["b", "c"]}, "list localhost among the servers"),
])
def test_a_run_over_servers_it_cannot_make_is_refused_before_anything_starts(kwargs, says):
    servers = parse_servers(kwargs.pop("servers", ["localhost", "b"]))
    with pytest.raises(UserError, match=says):
        emulation(topologies.build(planes=2, nodes=2, leaves=1, spines=1), servers=servers, **kwargs)


def _remote_exec(stdin: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "emulator.net.remote_exec"], input=stdin, capture_output=True,
                          text=True, timeout=30)


def test_the_servers_end_runs_the_headers_argument_list_with_the_rest_of_the_input():
    done = _remote_exec(json.dumps({"argv": ["cat"]}) + "\nthe command's own input\n")
    assert (done.returncode, done.stdout) == (0, "the command's own input\n")
    done = _remote_exec(json.dumps({"argv": ["sh", "-c", "exit 7"]}) + "\n")
    assert done.returncode == 7  # the command's own status, as ssh passes it on


@pytest.mark.parametrize("header, says", [("not json", "bad header"), ('{"argv": []}', "no argv list"),
                                          ('{"argv": "ls -l"}', "no argv list")])
def test_the_servers_end_refuses_a_bad_header(header, says):
    done = _remote_exec(header + "\n")
    assert done.returncode == 2 and says in done.stderr


def test_the_servers_end_answers_each_byte_with_its_clock():
    """Its CLOCK_MONOTONIC, and how far its CLOCK_REALTIME is ahead of that."""
    ahead = time.time_ns() - time.monotonic_ns()
    done = _remote_exec(json.dumps({"clock": True}) + "\n???")
    answers = [tuple(map(int, line.split())) for line in done.stdout.splitlines()]
    stamps = [stamp for stamp, _ in answers]
    assert len(stamps) == 3 and stamps == sorted(stamps)
    assert all(abs(theirs - ahead) < 10**7 for _, theirs in answers)  # this machine's: the same clocks


def test_a_servers_agent_results_move_to_our_clock():
    """Every time stamp less the server's offset; a one-way delay less the receiver's offset and plus the
    sender's; a time not yet taken (0) stays 0."""
    result = HostResult("a", 5_000, sent={"1": Sent(5_100, 5_200, 0, 2)},
                        received={"2": Delivery(6_000, 5_900, 9, 1_800, arrived_ns=5_950),
                                  "3": Delivery(6_100, 6_050, 9, 50, arrived_ns=0)}, rtt_us=[7.0])
    moved = to_local_clock(result, 1_000, {"2": 0, "3": 1_000})
    assert moved.t0_ns == 4_000 and moved.rtt_us == [7.0]
    assert moved.sent["1"] == Sent(4_100, 4_200, 0, 2)
    assert moved.received["2"] == Delivery(5_000, 4_900, 9, 800, arrived_ns=4_950)  # sent here, received there
    assert moved.received["3"].one_way_ns == 50 and moved.received["3"].arrived_ns == 0
    assert result.t0_ns == 5_000  # the server's own result is left as it came


def test_another_servers_series_join_ours_on_our_time_line():
    fabric = topologies.build(planes=2, nodes=2, leaves=1, spines=1)
    ours = LinkSampler(fabric)
    ours.started_ns = 10_000_000_000
    ours.rows, ours.planes = [(0.2, "link_util", "p0l0-eth1", 0.5)], {0: [(0.2, 5.0)]}
    cpu = merge_samples(ours, ServerSamples(10_300_000_000, [(0.2, "link_util", "p1l0-eth1", 0.9)],
                                            {"p1l0-eth1": [0.95]}, {"1": [(0.2, 9.0)]}, [(1.0, 0.6, 0.7, 0.1, 0.2)]))
    assert ours.rows == [(0.2, "link_util", "p0l0-eth1", 0.5), (0.5, "link_util", "p1l0-eth1", 0.9)]
    assert ours.planes == {0: [(0.2, 5.0)], 1: [(0.5, 9.0)]} and ours.backlogged == {"p1l0-eth1": [0.95]}
    assert cpu == [(1.3, 0.6, 0.7, 0.1, 0.2)]


def test_a_cluster_runs_verdict_names_each_server_and_counts_each_tunnel_packet_once():
    tunnel = {"tx_packets": 10, "rx_packets": 12, "tx_bytes": 90_000, "rx_bytes": 100_000}
    servers = {"localhost": ServerSummary(cpu_bound=False, cpu_idle=0.4, tunnels={"n0nv-x1": tunnel}),
               "gpu2": ServerSummary(cpu_bound=True, cpu_idle=0.0, tunnels={"n0nv-x0": tunnel})}
    assert servers_verdict(servers) == ("; per server: localhost idle min 40%, gpu2 CPU-BOUND, idle min 0%; tunnels "
                                        "between servers carried 20 packets (0.2 MB)")
    assert servers_verdict({}) == ""
    servers["gpu2"].clock_drift = {"moved_ns": -1_500_000, "over_s": 30.0, "uncertain_ns": 40_000, "ppm": -50.0}
    assert servers_verdict(servers).endswith("(0.2 MB); gpu2's clock moved -1500 us (+/- 40) against ours over 30 s "
                                             "(-50 ppm): its times are off by up to that")

"""--link-mbps auto's prediction and choice (emulator.run.autorate) and how the commands take it. No root."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time

import pytest

from emulator.cli import options
from emulator.model import topologies
from emulator.model.errors import UserError
from emulator.model.schedule import Message
from emulator.run import autorate
from emulator.run.autorate import BUILT_IN, Costs
from traffic import patterns

PAPER = {"planes": 8, "nodes": 8, "leaves": 2, "spines": 2}


def _paper(mbps: float, **more):
    return topologies.build("mpft", link_mbps=mbps, **{**PAPER, **more})


def test_every_packet_counts_once_per_switch_it_crosses_and_its_control_datagrams_come_back():
    fabric = _paper(1)
    one = [Message(0, 0.0, "n0g0", "n7g0", 9000 * 3)]  # plane 0 both ends: leaf 0 -> spine -> leaf 1
    load = autorate.load_of(fabric, one, "none", BUILT_IN)
    payload_packets = 4  # 27,000 bytes at MTU 9000's payload
    assert load.data_packets == payload_packets and load.datagrams == 2 * payload_packets and load.agents == 2
    assert sum(load.hops.values()) == pytest.approx(3 * 2 * payload_packets)  # data there, ACKs back
    assert load.hops["p0l0"] == load.hops["p0l1"] == 2 * payload_packets
    pulled = autorate.load_of(fabric, one, "pull", BUILT_IN)  # one sender: hardly a repeat
    assert pulled.datagrams == pytest.approx(BUILT_IN.pulled(1) * payload_packets)
    assert autorate.PULL_BASE < BUILT_IN.pulled(1) < BUILT_IN.pulled(56) == BUILT_IN.pull_datagrams_per_packet
    inside = autorate.load_of(fabric, [dataclasses.replace(one[0], dst="n0g1")], "pull", BUILT_IN)  # NVLink: not pulled
    assert inside.datagrams == 2 * payload_packets and not inside.hops


def test_pulled_packets_cost_as_measured_at_the_calibrations_fan_in_and_less_where_fewer_senders_wait():
    """The calibration's all-to-all (every receiver's NIC serves 56 senders) is predicted at its measured figure;
    its NVLink packets (7 of 63 peers) at two datagrams; a permutation near the bare three."""
    fabric = _paper(1)
    a2a = patterns.all_to_all(fabric, size=64 * 1024)
    load = autorate.load_of(fabric, a2a, "pull", BUILT_IN)
    per = load.data_packets // 64 // 63  # packets per message
    pulled, inside = 64 * 56 * per, 64 * 7 * per
    assert load.datagrams == pytest.approx(pulled * BUILT_IN.pull_datagrams_per_packet + inside * 2)
    perm = autorate.load_of(fabric, patterns.permutation(fabric, seed=1), "pull", BUILT_IN)
    assert perm.datagrams / perm.data_packets < autorate.PULL_BASE + 0.1


def test_the_need_grows_with_the_rate_and_the_daemons_yield_to_the_agents():
    fabric = _paper(1)
    messages = patterns.all_to_all(fabric, size=64 * 1024)
    load = autorate.load_of(fabric, messages, "pull", BUILT_IN)
    shares = []
    for mbps in autorate.RATES[:8]:
        p = autorate.predict(_paper(mbps), messages, load, BUILT_IN, "shared", mbps)
        assert p.switches <= BUILT_IN.daemon_yield * (BUILT_IN.machine_cores() - p.agents) + 1e-9
        shares.append(p.share)
    assert shares == sorted(shares)
    sparse = autorate.predict(fabric, messages, load, dataclasses.replace(BUILT_IN, daemon_yield=1.0), "shared")
    assert sparse.switches <= 1.0  # one daemon's thread: at most a core


def test_auto_chooses_the_highest_rate_that_fits_and_the_next_one_does_not():
    messages = patterns.all_to_all(_paper(1))
    chosen = autorate.choose(_paper, messages, "pull", BUILT_IN, "shared")
    assert chosen.fits() and chosen.mbps in autorate.RATES
    load = autorate.load_of(_paper(1), messages, "pull", BUILT_IN)
    above = autorate.RATES[autorate.RATES.index(chosen.mbps) + 1]
    assert not autorate.predict(_paper(above), messages, load, BUILT_IN, "shared", above).fits()
    # a machine with twice the cores carries a higher rate
    assert autorate.choose(_paper, messages, "pull", dataclasses.replace(BUILT_IN, cores=4), "shared").mbps > \
        chosen.mbps


def test_traffic_that_fits_at_no_rate_is_refused_naming_the_largest_fabric_that_would():
    slow = dataclasses.replace(BUILT_IN, agent_s_per_datagram=4e-4)  # agents 10x slower than here
    fabric = _paper(1)
    with pytest.raises(UserError, match="even at 1 Mbit/s"):
        autorate.choose(_paper, patterns.all_to_all(fabric), "pull", slow, "shared")

    def fewer(nodes: int):
        f = _paper(1, nodes=nodes)
        return f, patterns.all_to_all(f)
    smaller = autorate.largest_fitting(fewer, 8, "pull", slow, "shared")
    assert smaller is not None and smaller.params["nodes"] < 8
    load = autorate.load_of(*fewer(smaller.params["nodes"]), "pull", slow)
    assert autorate.predict(*fewer(smaller.params["nodes"]), load, slow, "shared").fits()


def test_measured_costs_are_cached_and_a_missing_or_broken_file_means_the_built_in_ones(tmp_path):
    path = tmp_path / "costs.json"
    assert autorate.load_costs(path) == BUILT_IN
    mine = Costs(1e-5, 1e-3, 2e-6, 0.4, 3.5, 8, "measured 2026-12-06 07:19")
    autorate.save_costs(mine, path)
    assert autorate.load_costs(path) == mine
    path.write_text("{not json")
    assert autorate.load_costs(path) == BUILT_IN


def _topo_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    options.add_topo_options(parser)
    return parser.parse_args(argv)


def test_link_mbps_takes_a_rate_or_auto_and_only_commands_with_traffic_take_auto(tmp_path):
    assert _topo_args(["--link-mbps", "2.5"]).link_mbps == 2.5
    with pytest.raises(SystemExit):
        _topo_args(["--link-mbps", "fast"])
    auto = _topo_args(["--link-mbps", "auto"])
    with pytest.raises(UserError, match="mpft traffic and mpft replay take it"):
        options.fabric_from_args(auto)  # mpft topo, up, alltoall: no schedule to fit
    assert options.fabric_from_args(auto, 1.5).rate("n0g0", "p0l0") == 1.5e6
    model = tmp_path / "fabric.json"
    topologies.build().save(model)
    with pytest.raises(UserError, match="not --fabric"):
        options.fabric_from_args(_topo_args(["--link-mbps", "auto", "--fabric", str(model)]), 1.0)


def test_auto_says_its_choice_in_one_line_and_hands_the_prediction_on(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("MPFT_COSTS", str(tmp_path / "none.json"))
    args = _topo_args(["--link-mbps", "auto", "--planes", "8", "--nodes", "8", "--leaves", "2", "--spines", "2"])
    fabric = options.fabric_from_args(args, 1.0)
    messages = patterns.all_to_all(fabric)
    chosen, record = options.auto_rate(args, fabric, messages, "pull")
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"--link-mbps auto: {record['mbps']:g} Mbit/s") and "\n" not in line
    assert chosen.rate("n0g0", "p0l0") == record["mbps"] * 1e6 and record["source"] == "built in"
    same, none = options.auto_rate(_topo_args([]), fabric, messages, "pull")
    assert same is fabric and none is None


def test_a_refusal_names_a_smaller_fabric_in_one_line(monkeypatch, tmp_path):
    path = tmp_path / "slow.json"
    autorate.save_costs(dataclasses.replace(BUILT_IN, agent_s_per_datagram=4e-4), path)
    monkeypatch.setenv("MPFT_COSTS", str(path))
    args = _topo_args(["--link-mbps", "auto", "--planes", "8", "--nodes", "8", "--leaves", "2", "--spines", "2"])
    fabric = options.fabric_from_args(args, 1.0)
    with pytest.raises(UserError) as refused:
        options.auto_rate(args, fabric, patterns.all_to_all(fabric), "pull", patterns.all_to_all)
    assert "even at 1 Mbit/s" in str(refused.value) and "the largest that fits has --nodes " in str(refused.value)
    assert refused.value.field == "--link-mbps" and "\n" not in str(refused.value)


def test_a_daemon_with_twice_the_ports_must_batch_past_what_it_can_before_the_machine_is_full():
    """128 GPUs at 2.5 Mbit/s: 57 % of the machine, but the shared daemon polls 256 ports per wake-up (measured at
    4 Mbit/s, pressure 9.9: UNFAITHFUL 3 of 3, packets lost at its input); the 64-GPU fabric at the same rate is
    within both limits."""
    def fabric(nodes: int, mbps: float):
        return topologies.build("mpft", link_mbps=mbps, **{**PAPER, "nodes": nodes})
    for nodes, fits in ((16, False), (8, True)):
        messages = patterns.all_to_all(fabric(nodes, 1))
        load = autorate.load_of(fabric(nodes, 1), messages, "pull", BUILT_IN)
        p = autorate.predict(fabric(nodes, 2.5), messages, load, BUILT_IN, "shared", 2.5)
        assert p.share <= autorate.SHARE and (p.pressure <= autorate.PRESSURE) == fits == p.fits()


AUTO_STUDY = """
name = "auto"
seeds = [1, 2]
[topology]
planes = 8
nodes = 8
leaves = 2
spines = 2
link_mbps = "auto"
[[traffic]]
pattern = "all-to-all"
[[variants]]
name = "spray"
app = "spray"
entropy = "spray"
[[variants]]
name = "rtt"
app = "spray"
entropy = "spray"
cc = "rtt"
[[variants]]
name = "fixed"
app = "ecmp"
topology = { link_mbps = 3 }
"""


def _auto_study(tmp_path, monkeypatch, costs: Costs = BUILT_IN):
    from emulator.study import runner, scenario  # the study layer sits above autorate
    monkeypatch.setenv("MPFT_COSTS", str(autorate.save_costs(costs, tmp_path / "costs.json")))
    s = scenario.parse(AUTO_STUDY, "auto.toml", tmp_path)
    fabrics = dict(s.fabrics)  # each built once, by the checker
    schedules = {(v.name, seed): runner.build_schedule(s, fabrics["spray"], seed, v.traffic)
                 for v in s.variants for seed in s.seeds}
    return s, fabrics, schedules, runner.auto_rate(s, fabrics, schedules, list(s.seeds), quiet=True,
                                                   costs=costs)


def test_a_study_with_link_mbps_auto_runs_every_variant_that_asks_at_one_rate_that_fits_them_all(tmp_path,
                                                                                                  monkeypatch):
    s, fabrics, schedules, predicted = _auto_study(tmp_path, monkeypatch)
    assert s.variants[0].topology["link_mbps"] == "auto"  # chosen per run, not at parse time
    alone = {name: autorate.choose(_paper, schedules[name, 1], cc, BUILT_IN).mbps
             for name, cc in (("spray", "pull"), ("rtt", "rtt"))}
    assert alone["rtt"] > alone["spray"]  # rtt sends half pull's datagrams: alone it would run faster
    mbps = min(alone.values())
    rate = {name: f.rate("n0g0", "p0l0") for name, f in fabrics.items()}
    assert rate["spray"] == rate["rtt"] == mbps * 1e6
    assert rate["fixed"] == 3e6 and ("fixed", 1) not in predicted
    assert sorted(predicted) == [(n, seed) for n in ("rtt", "spray") for seed in (1, 2)]
    assert all(p["mbps"] == mbps and p["share"] <= autorate.SHARE for p in predicted.values())
    assert predicted["rtt", 1]["agents"] < predicted["spray", 1]["agents"]


def test_a_study_whose_traffic_fits_at_no_rate_is_refused_naming_the_variant(tmp_path, monkeypatch):
    slow = dataclasses.replace(BUILT_IN, agent_s_per_datagram=1e-2)
    with pytest.raises(UserError) as refused:
        _auto_study(tmp_path, monkeypatch, slow)
    assert refused.value.file == "auto.toml" and refused.value.field == "variants.spray.topology.link_mbps"
    assert "even at 1 Mbit/s" in refused.value.message


def test_a_rate_that_is_neither_a_number_nor_auto_is_an_error_with_its_line(tmp_path):
    from emulator.study import scenario
    with pytest.raises(UserError) as bad:
        scenario.parse(AUTO_STUDY.replace('link_mbps = "auto"', 'link_mbps = "fast"'), "auto.toml", tmp_path)
    assert (bad.value.line, bad.value.field) == (9, "topology.link_mbps") and '"auto"' in bad.value.message


def test_a_core_busy_with_other_work_is_taken_off_the_cores_auto_fits_into():
    """A busy loop beside the choice: the costs count the cores it leaves (about one of two here), and auto picks
    a lower rate than for the whole machine."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        costs = BUILT_IN.with_free_cores(0.5)
    finally:
        busy.kill()
        busy.wait()
    machine = os.cpu_count() or 1
    assert 0 < costs.cores <= machine - 0.5
    messages = patterns.all_to_all(_paper(1))
    fewer = autorate.choose(_paper, messages, "pull", costs, "shared")
    assert fewer.mbps < autorate.choose(_paper, messages, "pull", BUILT_IN, "shared").mbps
    assert fewer.of_cores() == f"{costs.cores:g} cores (other work is using the rest of {machine})"

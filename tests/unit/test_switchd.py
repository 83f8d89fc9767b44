"""Where switches run, decided from the model: one private daemon and namespace per plane, the machine's own OVS
where a private one cannot serve; and which leftovers `mpft clean` may take for ours. No root."""

from __future__ import annotations

import pytest

from emulator.model import topologies
from emulator.net import runstate, switchd
from emulator.net.runstate import RunState, untracked_netns
from emulator.net.switchd import CONTROLLER_IP, SwitchDaemons, auto_mode, plane_groups, resolve_mode

RUN = "20261201-120000-a1b2c3"


def _daemons(fabric, mode="per-plane", datapath="user") -> SwitchDaemons:
    return SwitchDaemons(fabric, RunState(RUN, 0, 0.0), mode, datapath)


def test_each_plane_has_its_own_daemon_and_namespace():
    fabric = topologies.build("mpft", planes=4, nodes=4, leaves=2, spines=2)
    d = _daemons(fabric)
    assert d.private and d.control_netns == "mpft-a1b2c3-c"
    for switch in fabric.switches():
        plane = fabric.node(switch)["plane"]
        assert d.netns_of(switch) == f"mpft-a1b2c3-p{plane}"
        assert d.instance_of(switch).directory == RunState(RUN, 0, 0.0).directory / f"ovs-p{plane}"
        assert d.instance_of(switch).target(switch).endswith(f"ovs-p{plane}/{switch}.mgmt")
    assert all(d.netns_of(domain) is None for domain in fabric.nvlink_domains())  # kernel bridges stay in the root
    assert d.namespaces() == [None] + [f"mpft-a1b2c3-p{p}" for p in range(4)]
    assert d.controller_host() == CONTROLLER_IP


@pytest.mark.parametrize("mode, datapath", [("shared", "user"), ("per-plane", "kernel")])
def test_the_machines_own_ovs_serves_when_asked_or_for_the_kernel_datapath(mode, datapath):
    fabric = topologies.build("mpft", planes=2, nodes=4, leaves=2, spines=2)
    d = _daemons(fabric, mode, datapath)
    assert not d.private and d.control_netns is None
    assert {d.netns_of(s) for s in fabric.switches()} == {None}
    assert d.namespaces() == [None]
    assert d.instance_of("p0l0").target("p0l0") == "p0l0"  # ovs-ofctl finds the machine's own by name
    assert d.controller_host() == "127.0.0.1"


def test_a_link_between_planes_needs_one_daemon():
    fabric = topologies.build("mpft", planes=2, nodes=4, leaves=2, spines=2)
    fabric.graph.add_edge("p0s0", "p1s0", kind="switch", bps=1e7, ports={"p0s0": 99, "p1s0": 99})
    assert not _daemons(fabric).private


def test_an_unknown_mode_is_refused():
    with pytest.raises(Exception, match="choose one of auto, per-switch, per-plane, per-core, shared"):
        _daemons(topologies.build(), "one-per-switch")


def test_clean_takes_only_namespaces_named_as_a_run_names_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(runstate, "NETNS_DIR", tmp_path)
    names = ["mpft-a1b2c3-c", "mpft-a1b2c3-p0", "mpft-a1b2c3-p12", "mpft-ffffff-p1",  # runs' own
             "mpft-decoy-p0", "mpft-a1b2c3-x", "mpft-a1b2c3-p", "mpfttest-foreign", "mpft-A1B2C3-p0", "other"]
    for name in names:
        (tmp_path / name).write_text("")
    assert sorted(untracked_netns(live=set())) == ["mpft-a1b2c3-c", "mpft-a1b2c3-p0", "mpft-a1b2c3-p12",
                                                    "mpft-ffffff-p1"]
    assert untracked_netns(live={RUN}) == ["mpft-ffffff-p1"]  # a live run's namespaces are left alone


def test_per_switch_daemons_each_have_a_namespace_and_a_plane_is_theirs_alone():
    fabric = topologies.build("mpft", planes=2, nodes=4, leaves=2, spines=2)
    d = _daemons(fabric, "per-switch")
    assert [i.key for i in d.distinct()] == fabric.switches()
    assert d.netns_of("p1s0") == "mpft-a1b2c3-s-p1s0"
    assert d.instance_of("p1s0").target("p1s0").endswith("ovs-p1s0/p1s0.mgmt")
    assert sorted(i.key for i in d.plane_daemons(1)) == sorted(fabric.switches(plane=1))
    assert runstate.OUR_NETNS.fullmatch("mpft-a1b2c3-s-p1s0")  # `mpft clean` takes it for a run's own
    assert [i.key for i in _daemons(fabric, "per-plane").plane_daemons(0)] == ["p0"]
    assert _daemons(fabric, "shared").plane_daemons(0) == []


def test_per_core_daemons_serve_contiguous_groups_of_planes(monkeypatch):
    assert plane_groups(list(range(8)), "per-core", cores=2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert plane_groups(list(range(8)), "per-core", cores=3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert plane_groups([0, 1], "per-core", cores=4) == [[0], [1]]
    assert plane_groups([0, 1, 2], "per-plane") == [[0], [1], [2]]
    monkeypatch.setattr(switchd.os, "cpu_count", lambda: 2)
    d = _daemons(topologies.build("mpft", planes=4, nodes=4, leaves=2, spines=2), "per-core")
    assert d.netns_of("p1l0") == d.netns_of("p0s0") == "mpft-a1b2c3-p0"
    assert d.netns_of("p3l1") == "mpft-a1b2c3-p2"
    assert [i.key for i in d.distinct()] == ["p0-1", "p2-3"]
    assert d.plane_daemons(0) == []  # its daemon forwards plane 1 as well
    assert d.vswitchd_pids() == {}  # nothing started


def test_auto_gives_each_plane_a_daemon_while_there_is_a_core_for_it():
    two, eight = (topologies.build("mpft", planes=p, nodes=4, leaves=2, spines=2) for p in (2, 8))
    assert auto_mode(two, cores=2) == "per-plane"
    assert auto_mode(eight, cores=2) == "shared"
    assert auto_mode(eight, cores=8) == "per-plane"
    assert resolve_mode(two, "per-core", "kernel") == "shared"
    with pytest.raises(Exception, match="choose one of auto, per-switch, per-plane, per-core, shared"):
        resolve_mode(two, "one-per-switch")

"""Integration tier: spraying, fast failover and controller repair on the default 2-plane MPFT."""

from __future__ import annotations

import json
import time

import pytest

from emulator import topologies
from emulator.emulation import Emulation
from tests.integration.helpers import counters, delta, probe_cmd, run_json

pytestmark = pytest.mark.root
SRC, DST = "n0g0", "n15g0"  # plane 0: leaf 0 -> leaf 3


def _send(emu, packets, flows=1, vary=False, rate=2000):
    """UDP SRC->DST with a sink at DST; returns (sent, received)."""
    sink = emu.host(DST)
    sink.sendCmd(probe_cmd("sink", "--seconds", f"{packets * flows / rate + 2:.1f}"))
    emu.host(SRC).cmd("sleep 0.3")
    args = ["send", "--dst", emu.fabric.ip(DST), "--flows", str(flows), "--packets", str(packets),
            "--rate", str(rate), *(["--entropy", "16"] if vary else [])]
    sent = run_json(emu.host(SRC), probe_cmd(*args))["sent"]
    received = json.loads(sink.waitOutput().strip().splitlines()[-1])["received"]
    return sent, received


def _uplinks(fabric, leaf):
    return {spine: fabric.intf(leaf, spine) for spine in fabric.switches(role="spine", plane=0)}


@pytest.fixture(scope="module", params=["ecmp", "spray"])
def emu(request):
    with Emulation(topologies.build(), app=request.param, quiet=True) as running:
        running.app_name = request.param
        yield running


def test_one_flow_with_per_packet_entropy(emu):
    """Spray spreads one flow's 5,000 packets over every spine within 10 % of even; ECMP hashes it, so with a
    fixed source port it stays on one spine."""
    up = _uplinks(emu.fabric, "p0l0")
    before = counters(list(up.values()))
    vary = emu.app_name == "spray"
    sent, received = _send(emu, 5000, vary=vary)
    per_spine = delta(before, counters(list(up.values())))
    assert received == sent == 5000
    if vary:
        assert all(abs(n - 1250) <= 125 for n in per_spine.values()), per_spine
    else:
        assert max(per_spine.values()) >= 5000 and sum(per_spine.values()) < 5000 + 20, per_spine


def test_local_repair_when_a_leaf_uplink_fails(emu):
    """The leaf skips the dead uplink at once (watched buckets): nothing is lost, nothing crosses the cut."""
    fabric = emu.fabric
    emu.fail_link("p0l0", "p0s1")
    try:
        up = _uplinks(fabric, "p0l0")
        before = counters(list(up.values()))
        sent, received = _send(emu, 20, flows=64, vary=emu.app_name == "spray")
        per_spine = delta(before, counters(list(up.values())))
        assert received == sent
        assert per_spine[up["p0s1"]] == 0
        assert all(per_spine[up[s]] > 0 for s in up if s != "p0s1")
    finally:
        emu.restore()


def test_global_repair_when_a_spine_loses_its_link_to_the_far_leaf(emu):
    """p0s2 cannot reach leaf 3 any more and has no alternative: the controller must move leaf 0's traffic
    for leaf 3 off p0s2. After repair everything is delivered; after restore p0s2 carries traffic again."""
    fabric = emu.fabric
    up = _uplinks(fabric, "p0l0")
    emu.fail_link("p0s2", "p0l3")
    time.sleep(1.0)  # port-status -> controller -> recomputed routes on every switch
    try:
        before = counters(list(up.values()))
        sent, received = _send(emu, 20, flows=64, vary=emu.app_name == "spray")
        assert received == sent
        assert delta(before, counters(list(up.values())))[up["p0s2"]] == 0
    finally:
        emu.restore()
    time.sleep(1.0)
    before = counters(list(up.values()))
    sent, received = _send(emu, 20, flows=64, vary=emu.app_name == "spray")
    assert received == sent
    assert delta(before, counters(list(up.values())))[up["p0s2"]] > 0
    assert emu.net.verify_shaping() == []


def test_static_paths_are_collision_free_for_a_permutation(tmp_path):
    """The static app pins a shift permutation of plane 0 onto spines so that no two flows share a link."""

    from controllers.static_paths import permutation

    fabric = topologies.build()
    pairs = permutation(fabric, plane=0, shift=4)  # every GPU of a leaf to the next leaf: 4 flows per leaf pair
    pattern = tmp_path / "pattern.json"
    pattern.write_text(json.dumps({"pairs": pairs}))
    used = {}
    with Emulation(fabric, app="static", app_env={"MPFT_PATTERN": str(pattern)}, quiet=True) as emu:
        for src, dst in pairs:
            leaf = fabric.nic_links(src)[0][0]
            up = _uplinks(fabric, leaf)
            before = counters(list(up.values()))
            sink = emu.host(dst)
            sink.sendCmd(probe_cmd("sink", "--seconds", "1.5"))
            emu.host(src).cmd("sleep 0.2")
            emu.host(src).cmd(probe_cmd("send", "--dst", fabric.ip(dst), "--flows", "8", "--packets", "5"))
            sink.waitOutput()
            moved = delta(before, counters(list(up.values())))
            [spine] = [s for s, intf in up.items() if moved[intf] >= 40]  # all 8 source ports on one spine
            used[(src, dst)] = (leaf, spine)
    links_up = [(leaf, spine) for leaf, spine in used.values()]
    links_down = [(spine, fabric.nic_links(dst)[0][0]) for (_src, dst), (_leaf, spine) in used.items()]
    assert len(set(links_up)) == len(links_up) == len(pairs)
    assert len(set(links_down)) == len(links_down)


def test_a_user_app_given_by_path_places_new_flows(tmp_path):
    """The worked example loads by path, places each new flow on an uplink itself, and delivers everything."""
    import subprocess

    from tests.integration.helpers import REPO

    app = REPO / "controllers" / "examples" / "least_loaded.py"
    with Emulation(topologies.build(), app=str(app), quiet=True) as emu:
        up = _uplinks(emu.fabric, "p0l0")
        before = counters(list(up.values()))
        sent, received = _send(emu, 10, flows=16, rate=400)
        used = [s for s, n in delta(before, counters(list(up.values()))).items() if n > 0]
        pinned = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "dump-flows", "p0l0", "table=1,udp"],
                                capture_output=True, text=True).stdout
    assert received == sent == 160
    assert len(used) >= 2
    assert pinned.count("udp") >= 16  # one exact-match flow per new flow

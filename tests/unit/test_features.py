"""Feature detection for both kernels: the module-less CI kernel and a stock kernel (the Vagrant VM's)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from emulator.model.errors import UserError
from emulator.net import features, marking

# What ENVIRONMENT.md measured on the CI kernel, and what a stock Debian/Ubuntu kernel has.
CI_QDISCS = {"htb", "tbf", "pfifo", "bfifo", "ingress"}
CI_TCP = ["reno", "bbr", "cubic"]
STOCK_QDISCS = set(features.QDISCS)
STOCK_TCP = ["reno", "cubic", "bbr", "dctcp"]


def facts(module: bool, qdiscs: set[str], tcp: list[str]) -> features.Facts:
    """Facts shaped as probe() returns them: every probed qdisc present or absent."""
    return features.Facts(ovs_kernel_module=module, qdiscs={q: q in qdiscs for q in features.QDISCS},
                          tcp_congestion=list(tcp))


def mentions(feats: features.Features, word: str) -> bool:
    return any(word in item for item in feats.unavailable)


def test_module_less_ci_kernel():
    feats = features.decide(facts(module=False, qdiscs=CI_QDISCS, tcp=CI_TCP))
    assert feats.datapath == "user"
    assert feats.shaping
    assert (feats.link_delay, feats.link_loss, feats.ecn_marking) == (False, False, False)
    assert feats.tcp_congestion == CI_TCP
    for word in ("kernel datapath", "netem", "RED", "DCTCP", "PFC"):
        assert mentions(feats, word), word
    assert not mentions(feats, "shaping")
    assert len(feats.unavailable) == 5


def test_stock_kernel():
    feats = features.decide(facts(module=True, qdiscs=STOCK_QDISCS, tcp=STOCK_TCP))
    assert feats.datapath == "kernel"
    assert feats.shaping
    assert (feats.link_delay, feats.link_loss, feats.ecn_marking) == (True, True, True)
    assert feats.tcp_congestion == STOCK_TCP
    assert len(feats.unavailable) == 1
    assert mentions(feats, "PFC")


@pytest.mark.parametrize("module", [True, False])
def test_datapath_follows_the_module_alone(module):
    for qdiscs in (CI_QDISCS, STOCK_QDISCS):
        feats = features.decide(facts(module=module, qdiscs=qdiscs, tcp=CI_TCP))
        assert feats.datapath == ("kernel" if module else "user")
        assert mentions(feats, "kernel datapath") is not module


@pytest.mark.parametrize(("netem", "red"), [(True, False), (False, True)])
def test_netem_and_red_are_decided_separately(netem, red):
    qdiscs = CI_QDISCS | {q for q, present in (("netem", netem), ("red", red)) if present}
    feats = features.decide(facts(module=True, qdiscs=qdiscs, tcp=STOCK_TCP))
    assert (feats.link_delay, feats.link_loss, feats.ecn_marking) == (netem, netem, red)
    assert mentions(feats, "netem") is not netem
    assert mentions(feats, "RED") is not red


def test_the_ebpf_marker_marks_ecn_where_the_kernel_has_no_red():
    ci = facts(module=False, qdiscs=CI_QDISCS | {"clsact"}, tcp=CI_TCP)
    ci.ecn_bpf_missing = ""
    feats = features.decide(ci)
    assert (feats.ecn_marking, feats.ecn_marker) == (True, "bpf") and not mentions(feats, "ECN")
    ci.qdiscs["clsact"] = False
    assert not features.decide(ci).ecn_marking
    stock = facts(module=True, qdiscs=STOCK_QDISCS, tcp=STOCK_TCP)
    stock.ecn_bpf_missing = ""
    assert features.decide(stock).ecn_marker == "red"  # RED stays where the kernel has it


@pytest.mark.parametrize("missing", ["htb", "bfifo"])
def test_no_shaping_without_htb_or_bfifo(missing):
    for qdiscs in (CI_QDISCS, STOCK_QDISCS):
        feats = features.decide(facts(module=True, qdiscs=qdiscs - {missing}, tcp=STOCK_TCP))
        assert not feats.shaping
        assert any("shaping" in item and missing in item for item in feats.unavailable)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="the qdisc probe needs root")
def test_probe_on_this_machine_leaves_nothing_behind():
    def state() -> tuple[str, list[str], set[int]]:
        lo = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True, check=True)
        # Network namespaces kept alive by a bind mount (`ip netns add` and the like).
        kept = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if "net:[" in line]
        # Processes of our process group: anything the probe started and left running.
        group = os.getpgid(0)
        ours = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) == group:
                        ours.add(int(entry.name))
                except ProcessLookupError:
                    pass
        return lo.stdout, kept, ours

    before = state()
    probed = features.probe()
    after = state()
    assert after[0] == before[0], "the probe changed the qdisc of this namespace's loopback"
    assert after[1] == before[1], "the probe left a network namespace mounted"
    assert after[2] <= before[2], "the probe left processes running"

    assert probed.qdiscs["htb"]  # both kernels have HTB
    assert {"htb", "bfifo", "netem", "red"} <= probed.qdiscs.keys()  # every qdisc decide() consults
    assert probed.ovs_kernel_module == Path("/sys/module/openvswitch").exists()
    # the eBPF marker was built and loaded in a namespace of its own, its maps pinned on a BPF filesystem there
    if shutil.which("clang") and marking.HEADERS.exists():  # `make setup` installs both
        assert probed.ecn_bpf_missing == ""
    assert not list(marking.PIN_DIR.glob("mpft_ecn_*"))


@pytest.mark.parametrize("option", [{"delay_ms": 2.0}, {"loss_pct": 1.0}, {"ecn": True}])
def test_link_options_refused_where_the_kernel_lacks_them(option):
    from emulator.model import topologies
    from emulator.model.errors import UserError

    fabric = topologies.build("ft2", leaves=2, spines=1, hosts_per_leaf=1, **option)
    ci = features.decide(facts(False, CI_QDISCS, CI_TCP))
    with pytest.raises(UserError) as err:
        features.check_link_options(fabric, ci)
    assert err.value.field == next(iter(option))
    assert "unavailable on this kernel" in str(err.value)
    stock = features.decide(facts(True, STOCK_QDISCS, STOCK_TCP))
    features.check_link_options(fabric, stock)  # accepted where netem and RED exist


def test_plain_links_need_nothing_extra():
    from emulator.model import topologies

    ci = features.decide(facts(False, CI_QDISCS, CI_TCP))
    features.check_link_options(topologies.build("ft2", leaves=2, spines=1, hosts_per_leaf=1), ci)


@pytest.mark.parametrize(("choice", "marker"), [("auto", "red"), ("red", "red"), ("bpf", "bpf")])
def test_the_ecn_marker_can_be_chosen_where_the_kernel_has_both(choice, marker):
    both = dataclasses.replace(facts(module=True, qdiscs=STOCK_QDISCS, tcp=STOCK_TCP), ecn_bpf_missing="")
    feats = features.decide(both, choice)
    assert feats.ecn_marker == marker and feats.ecn_marking and feats.lossless


def test_a_marker_the_kernel_lacks_is_no_marker_and_says_why():
    ci = dataclasses.replace(facts(module=False, qdiscs=CI_QDISCS | {"clsact"}, tcp=CI_TCP), ecn_bpf_missing="")
    feats = features.decide(ci, "red")
    assert feats.ecn_marker == "" and not feats.ecn_marking and mentions(feats, "ECN marking by red (MPFT_ECN_MARKER)")
    assert features.decide(ci, "bpf").ecn_marker == "bpf"
    with pytest.raises(UserError):
        features.decide(ci, "codel")

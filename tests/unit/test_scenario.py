"""Scenario files: the built-in study loads and builds, a resolved scenario round-trips through JSON, every kind
of mistake names the right field and line, and no input (random text, random or mutated documents) raises
anything but a one-line UserError."""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.analysis import bounds
from emulator.model import topologies
from emulator.model.capture import MIN_SNAPLEN, CaptureOptions
from emulator.model.errors import UserError
from emulator.model.faults import Fault
from emulator.study import scenario
from emulator.study.positions import Positions
from traffic import patterns
from traffic.options import TransportOptions

REPO = Path(__file__).resolve().parents[2]

VALID = """\
name = "t"
seeds = [1, 2]

[topology]
planes = 2
nodes = 8
leaves = 2
spines = 2

[[traffic]]
pattern = "moe"
params = { tokens_per_gpu = 4 }

[[traffic]]
pattern = "ring-allreduce"
params = { size = 65536 }
start_s = 0.5

[[variants]]
name = "ecmp"
app = "ecmp"

[[variants]]
name = "spray"
app = "spray"
entropy = "spray"
topology = { link_mbps = 20 }

[[faults]]
at_s = 1.0
action = "fail_link"
link = ["p0l0", "p0s0"]

[quick]
seeds = [1]
topology = { nodes = 4 }
traffic_scale = 0.25
variants = ["ecmp"]
"""


def _parse(text, tmp_path, quick=False):
    path = tmp_path / "s.toml"
    path.write_text(text)
    return scenario.load(str(path), quick=quick)


# -- the built-in study ------------------------------------------------------------------------------------
@pytest.mark.parametrize("quick", [False, True])
def test_builtin_routing_loads_and_builds(quick):
    assert "routing" in scenario.builtin_names()
    s = scenario.load("routing", quick=quick)
    mix = [("ecmp", "ecmp", "fixed"), ("spray", "spray", "spray"), ("adaptive", "adaptive", "reps")]
    large = [("perm-ecmp", "ecmp", "fixed"), ("perm-spray", "spray", "spray"), ("perm-adaptive", "adaptive", "reps")]
    expected = mix[:1] + [("static", "static", "fixed")] + mix[1:] + large
    assert [(v.name, v.app, v.options.entropy) for v in s.variants] == expected
    assert [t.pattern for t in s.traffic] == ["moe", "ring-allreduce", "permutation"]
    assert s.seeds == (1, 2, 3)  # also in --quick: the suite checks spray and adaptive against ECMP over 3 seeds
    assert s.traffic_scale == (0.5 if quick else 1.0)
    for v in s.variants:  # the MoE mix on 16 GPUs; the large flows on plane 0 of 32 (4 leaves of 4 per plane)
        fabric = topologies.build(**v.topology)
        gpus = 32 if v.name.startswith("perm-") else 16
        assert fabric.topo == "mpft" and len(fabric.planes) == 2 and len(fabric.gpu_hosts()) == gpus
        assert v.traffic == ((2,) if v.name.startswith("perm-") else (0, 1))
    json.dumps(s.to_dict())


def test_builtin_routing_traffic_keeps_the_fabric_busy_for_a_few_seconds():
    """The schedule's lower bound at the study's rate (5 Mbit/s), every traffic at once: long enough to measure,
    short enough to repeat."""
    s = scenario.load("routing")
    fabric = topologies.build(**s.variants[0].topology)
    messages = patterns.mix(*(patterns.generate(item.pattern, fabric, **item.params) for item in s.traffic))
    assert 4.0 <= bounds.lower_bound_s(fabric, messages) <= 12.0


def test_unknown_name_lists_the_builtins():
    with pytest.raises(UserError, match="built in: .*routing"):
        scenario.load("no-such-study")


# -- a valid file ------------------------------------------------------------------------------------------
def test_valid_scenario_resolves_and_round_trips(tmp_path):
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "mine.py").write_text("")
    (tmp_path / "t.jsonl").write_text("")
    text = VALID.replace('app = "spray"', 'app = "apps/mine.py"') + '\n[[traffic]]\ntrace = "t.jsonl"\n'
    s = _parse(text, tmp_path)
    assert s.name == "t" and s.seeds == (1, 2) and not s.quick and s.timeout_s is None
    assert s.variants[1].app == str((tmp_path / "apps" / "mine.py").resolve())
    assert s.variants[0].topology == {"topo": "mpft", "planes": 2, "nodes": 8, "leaves": 2, "spines": 2}
    assert s.variants[1].topology["link_mbps"] == 20
    assert s.traffic[2].trace == (tmp_path / "t.jsonl").resolve() and s.traffic[2].format == "jsonl"
    assert s.faults == (Fault(at_s=1.0, action="fail_link", link=("p0l0", "p0s0"), switch=None),)

    data = s.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["traffic"][2]["trace"] == str((tmp_path / "t.jsonl").resolve())
    assert _parse(text, tmp_path) == s


def test_a_degraded_link_goes_both_ways_unless_told(tmp_path):
    text = VALID.replace('action = "fail_link"', 'action = "degrade_link"\nrate_fraction = 0.25')
    fault = _parse(text, tmp_path).faults[0]
    assert (fault.rate_fraction, fault.direction) == (0.25, "both")
    fault = _parse(text.replace("rate_fraction = 0.25", 'rate_fraction = 0.25\ndirection = "b_to_a"'),
                   tmp_path).faults[0]
    assert (fault.link, fault.direction) == (("p0l0", "p0s0"), "b_to_a")


def test_quick_applies_its_overrides(tmp_path):
    s = _parse(VALID, tmp_path, quick=True)
    assert s.quick and s.seeds == (1,) and s.traffic_scale == 0.25
    assert [v.name for v in s.variants] == ["ecmp"]
    assert s.variants[0].topology["nodes"] == 4


def test_transport_ordering_traffic_subset_and_optional(tmp_path):
    text = VALID.replace('entropy = "spray"', 'entropy = "spray"\ntransport = "tcp"\ncc = "bbr"\ntraffic = [1, 0, 1]'
                                              '\noptional = true')
    v = _parse(text, tmp_path).variants[1]
    assert (v.options.transport, v.options.cc, v.options.ordering, v.traffic, v.optional) == \
        ("tcp", "bbr", "psn", (0, 1), True)
    text = VALID.replace('entropy = "spray"', 'entropy = "spray"\nordering = "release"\nqueueing = "voq"')
    v = _parse(text, tmp_path).variants[1]
    assert v.options.ordering == "release" and v.topology["queueing"] == "voq"


def test_capture_takes_true_or_interfaces_and_nodes_and_a_snap_length(tmp_path):
    base = '[[traffic]]\npattern = "incast"\n[[variants]]\nname = "a"\napp = "ecmp"\n'
    assert _parse(base, tmp_path).capture is None
    assert _parse("capture = true\n" + base, tmp_path).capture == CaptureOptions(None, MIN_SNAPLEN)
    assert _parse('capture = ["p0l0", "n0g0-eth0"]\ncapture_bytes = 9100\n' + base, tmp_path).capture == \
        CaptureOptions(("p0l0", "n0g0-eth0"), 9100)


def test_defaults(tmp_path):
    s = _parse('[[traffic]]\npattern = "incast"\n[[variants]]\nname = "a"\napp = "ecmp"\n', tmp_path)
    assert s.name == "s" and s.seeds == (1,) and s.question == "" and s.faults == ()
    v = s.variants[0]
    assert v.options == TransportOptions()  # cc auto and window 0: left to the fabric
    assert (v.queueing, v.topology, v.traffic, v.optional) == ("fifo", {"topo": "mpft"}, None, False)


# -- mistakes: (replace this, with this, quick?) -> field, line --------------------------------------------
BAD = [
    ("nodes = 8", "nodes = = 8", False, None, 6),
    ("seeds = [1, 2]", 'seeds = [1, 2]\ncolour = "red"', False, "colour", 3),
    ('app = "ecmp"', 'app = "ecmp"\nspeed = 3', False, "variants[0].speed", 22),
    ("seeds = [1, 2]", "seeds = [1, true]", False, "seeds[1]", 2),
    ("seeds = [1, 2]", "seeds = []", False, "seeds", 2),
    ("seeds = [1, 2]", "seeds = [1, 4294967296]", False, "seeds[1]", 2),
    ("seeds = [1, 2]", "seeds = [2, 2]", False, "seeds", 2),
    ("seeds = [1, 2]", "seeds = 1979-05-27", False, "seeds", 2),
    ('entropy = "spray"', 'entropy = "spray"\nwindow = true', False, "variants[1].window", 27),
    ('entropy = "spray"', 'entropy = "spray"\nwindow = 64', False, "variants[1].window", 27),
    ('name = "spray"', 'name = "ecmp"', False, "variants[1].name", 24),
    ('name = "ecmp"', 'name = "e cmp"', False, "variants[0].name", 20),
    ('app = "ecmp"', 'app = "nope"', False, "variants[0].app", 21),
    ('app = "ecmp"', 'app = "missing.py"', False, "variants[0].app", 21),
    ('app = "ecmp"', "", False, "variants[0].app", 19),
    ('entropy = "spray"', 'entropy = "sideways"', False, "variants[1].entropy", 26),
    ('entropy = "spray"', 'entropy = "spray"\ncc = "fast"', False, "variants[1].cc", 27),
    ('entropy = "spray"', 'entropy = "spray"\nqueueing = "lifo"', False, "variants[1].queueing", 27),
    ('pattern = "moe"', 'pattern = "moe"\ntrace = "x.jsonl"', False, "traffic[0]", 10),
    ('pattern = "moe"', 'pattern = "mo"', False, "traffic[0].pattern", 11),
    ("{ tokens_per_gpu = 4 }", "{ tokens_per_gpu = 0 }", False, "traffic[0].params.tokens_per_gpu", 12),
    ("{ tokens_per_gpu = 4 }", "{ tokens_per_gpu = 4, start_s = 1 }", False, "traffic[0].params.start_s", 12),
    ("{ size = 65536 }", "{ sise = 65536 }", False, "traffic[1].params.sise", 16),
    ("{ size = 65536 }", '"x"', False, "traffic[1].params", 16),
    ("start_s = 0.5", "start_s = -1", False, "traffic[1].start_s", 17),
    ('pattern = "ring-allreduce"\nparams = { size = 65536 }', 'trace = "absent.jsonl"', False,
     "traffic[1].trace", 15),
    ('pattern = "ring-allreduce"', 'pattern = "ring-allreduce"\nformat = "jsonl"', False, "traffic[1].format", 16),
    ('pattern = "ring-allreduce"', 'pattern = "ring-allreduce"\ncomm_groups = "g.json"', False,
     "traffic[1].comm_groups", 16),
    ("planes = 2", "planes = 99", False, "topology.planes", 5),
    ("planes = 2", "planes = [2]", False, "topology.planes", 5),
    ("planes = 2", 'planes = 2\ntopo = "torus"', False, "topology.topo", 6),
    ("{ link_mbps = 20 }", "{ link_mbps = -1 }", False, "variants[1].topology.link_mbps", 27),
    ("{ link_mbps = 20 }", "{ colour = 1 }", False, "variants[1].topology.colour", 27),
    ("{ nodes = 4 }", "{ nodes = 0 }", True, "quick.topology.nodes", 36),
    ('["p0l0", "p0s0"]', '["p0l0", "p1s0"]', False, "faults[0].link", 32),
    ('["p0l0", "p0s0"]', '["p0l0"]', False, "faults[0].link", 32),
    ('action = "fail_link"', 'action = "explode"', False, "faults[0].action", 31),
    ('action = "fail_link"\nlink = ["p0l0", "p0s0"]', 'action = "fail_switch"\nswitch = "p9s9"', False,
     "faults[0].switch", 32),
    ('link = ["p0l0", "p0s0"]', 'link = ["p0l0", "p0s0"]\nswitch = "p0s0"', False, "faults[0].switch", 33),
    ("at_s = 1.0", "at_s = nan", False, "faults[0].at_s", 30),
    ('action = "fail_link"\nlink = ["p0l0", "p0s0"]', 'action = "degrade_link"\nlink = ["p0l0", "p0s0"]\n'
     'rate_fraction = 1.5', False, "faults[0].rate_fraction", 33),
    ('action = "fail_link"\nlink = ["p0l0", "p0s0"]', 'action = "degrade_link"\nlink = ["p0l0", "p0s0"]\n'
     'rate_fraction = 0.25\ndirection = "up"', False, "faults[0].direction", 34),
    ('link = ["p0l0", "p0s0"]', 'link = ["p0l0", "p0s0"]\ndirection = "both"', False, "faults[0].direction", 33),
    ('variants = ["ecmp"]', 'variants = ["ecmp", "nope"]', False, "quick.variants[1]", 38),
    ('entropy = "spray"', 'entropy = "spray"\ntransport = "quic"', False, "variants[1].transport", 27),
    ('entropy = "spray"', 'entropy = "spray"\ntransport = "tcp"\nordering = "fence"', False,
     "variants[1].ordering", 28),
    ('entropy = "spray"', 'entropy = "spray"\ntransport = "tcp"\ncc = "Cubic; rm"', False, "variants[1].cc", 28),
    ('entropy = "spray"', 'entropy = "spray"\nordering = "eventually"', False, "variants[1].ordering", 27),
    ('entropy = "spray"', 'entropy = "spray"\ntraffic = [2]', False, "variants[1].traffic", 27),
    ('entropy = "spray"', 'entropy = "spray"\ntraffic = []', False, "variants[1].traffic", 27),
    ('entropy = "spray"', 'entropy = "spray"\noptional = "yes"', False, "variants[1].optional", 27),
    ("traffic_scale = 0.25", "traffic_scale = 0", False, "quick.traffic_scale", 37),
    ("traffic_scale = 0.25", "traffic_scale = 0.25\nlevel = 2", False, "quick.level", 38),
    ('seeds = [1, 2]', 'seeds = [1, 2]\ntimeout_s = "soon"', False, "timeout_s", 3),
    ('seeds = [1, 2]', 'seeds = [1, 2]\ncapture = "yes"', False, "capture", 3),
    ('seeds = [1, 2]', 'seeds = [1, 2]\ncontroller = "tcp:faucet"', False, "controller", 3),
    ('seeds = [1, 2]', 'seeds = [1, 2]\ncapture = []', False, "capture", 3),
    ('seeds = [1, 2]', 'seeds = [1, 2]\nservers = "localhost,gpu2"', False, "servers", 3),
    ('seeds = [1, 2]', 'seeds = [1, 2]\nservers = ["gpu2", "gpu3"]', False, "servers", 3),
    ('seeds = [1, 2]', 'seeds = [1, 2]\nservers = ["localhost", "-oProxyCommand=x"]', False, "servers", 3),
    ('seeds = [1, 2]', 'seeds = [1, 2]\nservers = ["localhost", "gpu2", "gpu2"]', False, "servers", 3),
    ('seeds = [1, 2]', 'seeds = [1, 2]\nssh_config = "no-such-file"', False, "ssh_config", 3),
    ('seeds = [1, 2]', 'seeds = [1, 2]\ncapture = true\ncapture_bytes = 64', False, "capture_bytes", 4),
]


@pytest.mark.parametrize("old, new, quick, field, line", BAD)
def test_mistakes_name_field_and_line(tmp_path, old, new, quick, field, line):
    assert old in VALID
    with pytest.raises(UserError) as caught:
        _parse(VALID.replace(old, new), tmp_path, quick)
    err = caught.value
    assert (err.file, err.line, err.field) == (str(tmp_path / "s.toml"), line, field)
    assert str(err).startswith(f"{tmp_path / 's.toml'}:{line}: " + (f"{field}: " if field else "invalid TOML"))
    assert len(str(err).splitlines()) == 1


def test_servers_spread_every_run(tmp_path):
    """servers and ssh_config (relative to the scenario) reach every run."""
    (tmp_path / "ssh.conf").write_text("Host gpu2\n  User root\n")
    text = VALID.replace("seeds = [1, 2]", 'seeds = [1, 2]\nservers = ["localhost", "root@gpu2:2222"]\n'
                                          'ssh_config = "ssh.conf"')
    s = _parse(text, tmp_path)
    assert [str(server) for server in s.servers] == ["localhost", "root@gpu2:2222"]
    assert s.ssh_config == tmp_path / "ssh.conf"
    assert json.loads(json.dumps(s.to_dict()))["ssh_config"] == str(tmp_path / "ssh.conf")


def test_missing_traffic_has_no_line(tmp_path):
    text = VALID.split("[[traffic]]")[0] + "[[variants]]" + VALID.split("[[variants]]", 1)[1]
    with pytest.raises(UserError) as caught:
        _parse(text, tmp_path)
    assert (caught.value.line, caught.value.field) == (None, "traffic")


def test_lines_follow_sub_tables_and_multi_line_values(tmp_path):
    text = ('question = """a \\\n  [[variants]] \\\n  name = 1"""\n'   # looks like a table, is a string
            "seeds = [\n  1,\n  2,\n  -3,\n]\n"
            '[[traffic]]\npattern = "moe"\n[traffic.params]\nhidden = 1\n"top_k" = 0\n')
    with pytest.raises(UserError) as caught:
        _parse(text, tmp_path)
    assert (caught.value.field, caught.value.line) == ("seeds[2]", 7)
    with pytest.raises(UserError) as caught:
        _parse(text.replace("-3", "3"), tmp_path)
    assert (caught.value.field, caught.value.line) == ("traffic[0].params.top_k", 13)


# -- properties --------------------------------------------------------------------------------------------
def _check_parse(text):
    """parse either succeeds with a JSON-able scenario or raises a one-line UserError naming the file."""
    try:
        s = scenario.parse(text, "h.toml", scenario.STUDIES_DIR)
    except UserError as err:
        assert err.file == "h.toml" and len(str(err).splitlines()) == 1
    else:
        json.dumps(s.to_dict())


TOML_ISH = st.lists(st.sampled_from(list('[]{}="\'.,#\n =abc01-_tf\\') + [
    "[[variants]]", "[quick]", "name", "seeds", '"""', "'''", '"ecmp"', "2"])).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(), TOML_ISH))
def test_any_text_gives_a_scenario_or_a_user_error(text):
    _check_parse(text)


KEYS = sorted(set(scenario.TOP_KEYS + scenario.TRAFFIC_KEYS + scenario.VARIANT_KEYS + scenario.FAULT_KEYS
                  + scenario.QUICK_KEYS + ("params", "tokens_per_gpu", "size", "nodes", "planes", "topo")))
SCALARS = st.one_of(
    st.integers(-1000, 1000), st.sampled_from([0, 1, 2**32, 2**63, -(2**64)]), st.booleans(),
    st.floats(), st.text(max_size=12), st.sampled_from(["ecmp", "spray", "moe", "mpft", "fail_link", "p0l0"]),
    st.dates())
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), inner,
                                                 max_size=4)), max_leaves=12)
DOCS = st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), VALUES, max_size=6)


def _toml_string(s):
    return '"' + "".join(_toml_char(c) for c in s) + '"'


def _toml_char(c):
    if c in '"\\':
        return "\\" + c
    if c.isprintable():
        return c
    return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"


def _toml_key(k):
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_string(k)


def _inline(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, (int, datetime.date)):
        return str(v)
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, list):
        return "[" + ", ".join(_inline(x) for x in v) + "]"
    return "{ " + ", ".join(f"{_toml_key(k)} = {_inline(x)}" for k, x in v.items()) + " }"


def _render(doc):
    """A document as TOML (tables as [headers], lists of tables as [[headers]]) and the line of every place."""
    lines, where = [], {}

    def note(key, value):
        where.setdefault(key, len(lines))
        if isinstance(value, dict):
            for k, x in value.items():
                note(key + (k,), x)
        elif isinstance(value, list):
            for i, x in enumerate(value):
                note(key + (i,), x)

    def pairs(table, prefix):
        for k, v in table.items():
            lines.append(f"{_toml_key(k)} = {_inline(v)}")
            note(prefix + (k,), v)

    def is_tables(v):
        return isinstance(v, list) and v and all(isinstance(x, dict) for x in v)

    pairs({k: v for k, v in doc.items() if not isinstance(v, dict) and not is_tables(v)}, ())
    for k, v in doc.items():
        if isinstance(v, dict):
            lines.append(f"[{_toml_key(k)}]")
            where[(k,)] = len(lines)
            pairs(v, (k,))
        elif is_tables(v):
            for i, x in enumerate(v):
                lines.append(f"[[{_toml_key(k)}]]")
                where.setdefault((k,), len(lines))
                where[(k, i)] = len(lines)
                pairs(x, (k, i))
    return "\n".join(lines) + "\n", where


@settings(max_examples=200, deadline=None)
@given(DOCS)
def test_random_documents_give_a_scenario_or_a_user_error(doc):
    text, _ = _render(doc)
    _check_parse(text)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)),
                       st.recursive(SCALARS.filter(lambda v: not (isinstance(v, float) and math.isnan(v))),
                                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                                    max_leaves=8), max_size=6))
def test_lines_found_match_the_rendered_lines(doc):
    text, where = _render(doc)
    assert tomllib.loads(text) == doc
    lines = Positions(text)
    for key, line in where.items():
        assert lines.line(key) == line, key


ROUTING = tomllib.loads((scenario.STUDIES_DIR / "routing.toml").read_text())


def _places(value, key=()):
    yield key
    if isinstance(value, dict):
        for k, x in value.items():
            yield from _places(x, key + (k,))
    elif isinstance(value, list):
        for i, x in enumerate(value):
            yield from _places(x, key + (i,))


def _replace(value, key, new):
    if not key:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[key[0]] = _replace(value[key[0]], key[1:], new)
    return copy


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(_places(ROUTING))[1:]), VALUES, st.booleans())
def test_mutated_routing_gives_a_scenario_or_a_user_error(key, value, quick):
    text, _ = _render(_replace(ROUTING, key, value))
    try:
        s = scenario.parse(text, "routing.toml", scenario.STUDIES_DIR, quick=quick)
    except UserError as err:
        assert err.file == "routing.toml" and len(str(err).splitlines()) == 1
    else:
        json.dumps(s.to_dict())


@pytest.mark.parametrize("datapath, daemons, plane, problem", [
    ("user", "per-plane", 1, None),
    ("user", "per-plane", 7, "no plane 7 in the fabric of variant"),
    ("user", "per-plane", "1", "must be a whole number from 0 to 255"),
    ("user", "shared", 1, "fail_plane needs a switch daemon per plane"),
    ("kernel", "per-plane", 1, "with fail_switch instead"),
])
def test_fail_plane_takes_a_plane_of_every_variant_with_a_daemon_of_its_own(tmp_path, datapath, daemons, plane,
                                                                            problem):
    """The file's check finds the plane; the machine's pass (runner.check_faults) the daemon to freeze, and both
    name the fault's line."""
    from emulator.study import runner  # the machine's pass sits above the checker
    old = 'action = "fail_link"\nlink = ["p0l0", "p0s0"]'
    text = VALID.replace(old, f'action = "fail_plane"\nplane = {json.dumps(plane)}')
    with pytest.raises(UserError, match=problem) if problem else contextlib.nullcontext() as caught:
        runner.check_faults(_parse(text, tmp_path), datapath, daemons)
    if problem is None:
        assert _parse(text, tmp_path).faults == (Fault(1.0, "fail_plane", None, None, plane=1),)
    else:
        assert caught.value.field == "faults[0].plane" and caught.value.line == 32


BLOCKED = ("mininet", "os_ken", "emulator.net", "emulator.run")
STANDALONE = f"""
import importlib.abc, sys
BLOCKED = {BLOCKED!r}
def blocked(name):
    return any(name == b or name.startswith(b + ".") for b in BLOCKED)
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if blocked(name):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from emulator.study import scenario, schema
for name in scenario.builtin_names():
    scenario.load(name)
    scenario.load(name, quick=True)
schema.text()
print(sorted(m for m in sys.modules if blocked(m)))
"""


def test_every_builtin_is_checked_and_the_schema_generated_with_the_live_stack_blocked():
    """Nothing of Mininet, os-ken, emulator.net or emulator.run is imported (import-linter's second contract says
    the same of our modules): a scenario can be checked where none of them is installed."""
    run = subprocess.run([sys.executable, "-c", STANDALONE], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"

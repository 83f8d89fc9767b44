"""Traffic patterns: byte accounting, node-limited routing, determinism, derangements, ring chains, mix, and
that every generator's schedule passes schedule.check against the fabric's hosts."""

from __future__ import annotations

import inspect
from collections import Counter, defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.model import schedule
from emulator.model.errors import UserError
from emulator.model.topologies import build
from traffic import patterns


@pytest.fixture(scope="module")
def fabric():
    return build("mpft", storage=True)


def _bytes(messages, tag):
    return {(m.src, m.dst): m.bytes for m in messages if m.tag == tag}


# -- MoE ---------------------------------------------------------------------------------------------------
MOE = {"tokens_per_gpu": 16, "top_k": 8, "experts_per_gpu": 4, "node_limit": 4, "seed": 3}


def test_moe_routes_respect_the_node_limit_and_top_k(fabric):
    routes = patterns.moe_routes(fabric, **MOE)
    assert set(routes) == set(fabric.hosts("gpu"))
    for tokens in routes.values():
        assert len(tokens) == MOE["tokens_per_gpu"]
        for gpus in tokens:
            assert len(gpus) == MOE["top_k"]
            assert len({fabric.node(g)["node"] for g in gpus}) <= MOE["node_limit"]
            assert max(Counter(gpus).values()) <= MOE["experts_per_gpu"]


def test_moe_bytes_follow_the_formula(fabric):
    hidden, scale = 1000, 0.5
    d = round(hidden * scale)
    messages = patterns.moe(fabric, hidden=hidden, scale=scale, **MOE)
    routes = patterns.moe_routes(fabric, **MOE)
    # one scale-out copy per remote node reached; one NVLink copy per other expert GPU of a reached node
    out_tokens = nvlink_tokens = 0
    for src, tokens in routes.items():
        own = fabric.node(src)["node"]
        for gpus in tokens:
            nodes = {fabric.node(g)["node"] for g in gpus}
            out_tokens += len(nodes - {own})
            relays = {f"n{n}g{fabric.node(src)['gpu']}" for n in nodes}
            nvlink_tokens += len(set(gpus) - relays)
    dispatch, combine = _bytes(messages, "moe/dispatch"), _bytes(messages, "moe/combine")
    dnv, cnv = _bytes(messages, "moe/dispatch-nvlink"), _bytes(messages, "moe/combine-nvlink")
    assert sum(dispatch.values()) == out_tokens * d
    assert sum(dnv.values()) == nvlink_tokens * d
    assert sum(dispatch.values()) <= len(routes) * MOE["tokens_per_gpu"] * MOE["node_limit"] * d
    # combine is the reverse of dispatch at 2 bytes per element instead of 1
    assert combine == {(b, a): 2 * n for (a, b), n in dispatch.items()}
    assert cnv == {(b, a): 2 * n for (a, b), n in dnv.items()}
    assert len(dispatch) + len(combine) + len(dnv) + len(cnv) == len(messages)


def test_moe_scale_out_stays_in_plane_and_nvlink_in_node(fabric):
    for m in patterns.moe(fabric, **MOE):
        a, b = fabric.node(m.src), fabric.node(m.dst)
        if m.tag in ("moe/dispatch", "moe/combine"):
            assert a["plane"] == b["plane"] and a["node"] != b["node"]
        else:
            assert a["node"] == b["node"]


def test_moe_combine_waits_for_what_its_sender_received(fabric):
    messages = patterns.moe(fabric, **MOE)
    received = defaultdict(set)  # by the earlier phases
    for m in messages:
        if m.tag != "moe/combine":
            received[m.dst].add(m.id)
    for m in messages:
        if m.tag == "moe/dispatch":
            assert m.deps == ()
        elif m.tag == "moe/combine":
            assert set(m.deps) == received[m.src]
        else:
            assert m.deps and all(messages[d].dst == m.src and d < m.id for d in m.deps)


def test_moe_rejects_more_experts_than_the_nodes_hold(fabric):
    with pytest.raises(UserError) as err:
        patterns.moe(fabric, top_k=9, experts_per_gpu=1, node_limit=4)
    assert err.value.field == "top_k"


# -- incast and permutations -------------------------------------------------------------------------------
def test_incast(fabric):
    messages = patterns.incast(fabric, senders=6, receiver="n3g1", size=1000, seed=1)
    assert len(messages) == 6 and {m.dst for m in messages} == {"n3g1"}
    assert len({m.src for m in messages}) == 6 and all(m.bytes == 1000 for m in messages)
    assert all(fabric.node(m.src)["node"] != 3 for m in messages)
    with pytest.raises(UserError) as err:
        patterns.incast(fabric, senders=31)
    assert err.value.field == "senders"


@pytest.mark.parametrize("plane", [0, 1])
def test_shift_permutation_within_a_plane(fabric, plane):
    messages = patterns.permutation(fabric, kind="shift", shift=3, plane=plane)
    order = patterns.compute_hosts(fabric, plane)
    assert [(m.src, m.dst) for m in messages] == [(h, order[(i + 3) % 16]) for i, h in enumerate(order)]
    assert all(fabric.node(h)["plane"] == plane for m in messages for h in (m.src, m.dst))


def test_shift_by_the_host_count_is_refused(fabric):
    with pytest.raises(UserError) as err:
        patterns.permutation(fabric, kind="shift", shift=16, plane=0)
    assert err.value.field == "shift"


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32), plane=st.sampled_from([None, 0, 1]))
def test_random_permutation_is_a_derangement(fabric, seed, plane):
    messages = patterns.permutation(fabric, seed=seed, plane=plane)
    hosts = patterns.compute_hosts(fabric, plane)
    assert sorted(m.src for m in messages) == sorted(hosts) == sorted(m.dst for m in messages)
    assert all(m.src != m.dst for m in messages)


@pytest.mark.parametrize("plane", [None, 0])
def test_all_to_all_sends_every_ordered_pair_once(fabric, plane):
    messages = patterns.all_to_all(fabric, size=1000, plane=plane)
    hosts = patterns.compute_hosts(fabric, plane)
    pairs = [(m.src, m.dst) for m in messages]
    assert sorted(pairs) == sorted((a, b) for a in hosts for b in hosts if a != b)
    assert all(m.bytes == 1000 and m.start_s == 0.0 for m in messages)


# -- ring collectives --------------------------------------------------------------------------------------
def test_ring_allreduce_steps_and_chain(fabric):
    hosts = patterns.compute_hosts(fabric, 0)
    n, size = len(hosts), 64 * 1000
    messages = patterns.ring_allreduce(fabric, size=size, plane=0)
    assert len(messages) == 2 * (n - 1) * n
    assert Counter(m.src for m in messages) == {h: 2 * (n - 1) for h in hosts}
    assert {m.bytes for m in messages} == {size // n}
    for m in messages:
        step = m.id // n
        assert (hosts.index(m.dst) - hosts.index(m.src)) % n == 1
        if step == 0:
            assert m.deps == ()
        else:
            (dep,) = m.deps
            assert dep // n == step - 1 and messages[dep].dst == m.src
    assert Counter(m.tag for m in messages) == {"ring-allreduce/reduce-scatter": (n - 1) * n,
                                                "ring-allreduce/allgather": (n - 1) * n}


@pytest.mark.parametrize("generator", [patterns.allgather, patterns.reduce_scatter])
def test_half_rings_have_n_minus_1_steps(fabric, generator):
    ring = ["n0g0", "n5g0", "n2g0", "n9g0"]
    messages = generator(fabric, size=4000, hosts=ring)
    assert Counter(m.src for m in messages) == {h: 3 for h in ring}
    assert {m.bytes for m in messages} == {1000}


# -- storage -----------------------------------------------------------------------------------------------
def test_storage_reads_and_writes(fabric):
    messages = patterns.storage(fabric, chunk_bytes=4096, reads=3, writes=2, seed=5)
    clients, servers = set(fabric.hosts("storage_client")), set(fabric.hosts("storage_server"))
    reads = [m for m in messages if m.tag == "storage/read"]
    writes = [m for m in messages if m.tag == "storage/write"]
    assert len(reads) == 3 * len(clients) and len(writes) == 2 * len(clients)
    assert all(m.src in servers and m.dst in clients for m in reads)
    assert all(m.src in clients and m.dst in servers for m in writes)
    # round robin: a client's five chunks sit on all four servers
    assert all(len({m.src for m in reads if m.dst == c} | {m.dst for m in writes if m.src == c}) == 4
               for c in clients)


def test_storage_needs_a_storage_plane():
    with pytest.raises(UserError) as err:
        patterns.storage(build("mpft"))
    assert err.value.field == "storage"


# -- every pattern -----------------------------------------------------------------------------------------
SEEDED = [name for name, gen in patterns.PATTERNS.items() if "seed" in inspect.signature(gen).parameters]
PATTERNS_WITHOUT_STORAGE = [name for name in patterns.PATTERNS if name != "storage"]


@pytest.mark.parametrize("name", patterns.PATTERNS)
def test_defaults_pass_check_and_are_deterministic(fabric, name):
    messages = patterns.generate(name, fabric)
    assert [m.id for m in messages] == list(range(len(messages)))
    assert schedule.check(messages, fabric.hosts()) == messages
    assert patterns.generate(name, fabric) == messages


@pytest.mark.parametrize("name", SEEDED)
def test_seeds_differ(fabric, name):
    assert patterns.generate(name, fabric, seed=1) != patterns.generate(name, fabric, seed=2)


def test_plain_fat_trees_have_hosts_for_every_compute_pattern():
    for topo in ("ft2", "ft3"):
        fabric = build(topo)
        for name in PATTERNS_WITHOUT_STORAGE:
            schedule.check(patterns.generate(name, fabric), fabric.hosts())


SMALL = {p: build("mpft", planes=p, nodes=n, leaves=1, spines=1, storage=True) for p, n in [(1, 3), (2, 2), (3, 4)]}


@settings(max_examples=150, deadline=None)
@given(data=st.data(), name=st.sampled_from(list(patterns.PATTERNS)), shape=st.sampled_from(list(SMALL)))
def test_small_random_params_pass_check(data, name, shape):
    fabric = SMALL[shape]
    gpus = len(fabric.hosts("gpu"))
    draw = {
        "moe": lambda: {"tokens_per_gpu": data.draw(st.integers(1, 8)), "hidden": data.draw(st.integers(1, 64)),
                        "top_k": data.draw(st.integers(1, 3)), "experts_per_gpu": data.draw(st.integers(1, 3)),
                        "node_limit": data.draw(st.integers(1, 4)),
                        "scale": data.draw(st.floats(0.01, 10)), "seed": data.draw(st.integers(0, 99))},
        "incast": lambda: {"senders": data.draw(st.integers(1, gpus - shape)), "seed": data.draw(st.integers(0, 99))},
        "permutation": lambda: {"kind": data.draw(st.sampled_from(["random", "shift"])),
                                "shift": data.draw(st.integers(1, gpus - 1)), "seed": data.draw(st.integers(0, 99))},
        "storage": lambda: {"reads": data.draw(st.integers(0, 3)), "writes": data.draw(st.integers(1, 3)),
                            "seed": data.draw(st.integers(0, 99))},
    }.get(name, lambda: {"size": data.draw(st.integers(1, 10**6))})
    params = patterns.check_params(name, draw())
    try:
        messages = patterns.generate(name, fabric, **params)
    except UserError as err:  # only the documented refusals: too many experts for the nodes, or nothing sent
        assert (name, err.field) in {("moe", "top_k"), ("moe", "pattern")}
        return
    assert [m.id for m in messages] == list(range(len(messages)))
    schedule.check(messages, fabric.hosts())


# -- mix and parameter checks ------------------------------------------------------------------------------
def test_mix_renumbers_ids_and_deps(fabric):
    ring = patterns.allgather(fabric, size=4000, hosts=["n0g0", "n1g0", "n2g0"])
    storage = patterns.storage(fabric, reads=1, writes=0, start_s=2.0, tclass=3)
    merged = patterns.mix(storage, ring)
    assert [m.id for m in merged] == list(range(len(storage) + len(ring)))
    assert merged[: len(storage)] == storage
    tail = merged[len(storage):]
    assert [m.deps for m in tail] == [tuple(d + len(storage) for d in m.deps) for m in ring]
    assert [(m.src, m.dst, m.start_s, m.tclass) for m in tail] == [(m.src, m.dst, m.start_s, m.tclass) for m in ring]
    assert {m.start_s for m in merged[: len(storage)]} == {2.0}
    schedule.check(merged, fabric.hosts())


@pytest.mark.parametrize("name, params, field", [
    ("nope", {}, "pattern"),
    ("moe", {"tokens": 3}, "tokens"),
    ("moe", {"top_k": 0}, "top_k"),
    ("moe", {"scale": "big"}, "scale"),
    ("incast", {"senders": True}, "senders"),
    ("permutation", {"kind": "zigzag"}, "kind"),
    ("ring-allreduce", {"hosts": "n0g0"}, "hosts"),
    ("storage", {"tclass": 8}, "tclass"),
])
def test_check_params_names_the_bad_field(name, params, field):
    with pytest.raises(UserError) as err:
        patterns.check_params(name, params)
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_check_params_accepts_null_for_optional_params(fabric):
    assert patterns.check_params("incast", {"receiver": None, "plane": None}) == {"receiver": None, "plane": None}


def test_unknown_hosts_are_user_errors(fabric):
    with pytest.raises(UserError) as err:
        patterns.generate("ring-allreduce", fabric, hosts=["n0g0", "x9"])
    assert err.value.field == "hosts"
    with pytest.raises(UserError) as err:
        patterns.generate("incast", fabric, receiver="x9")
    assert err.value.field == "receiver"


# -- write then flag ---------------------------------------------------------------------------------------
def test_write_flag_pairs_a_data_write_with_a_flag_send(fabric):
    messages = patterns.write_flag(fabric, pairs=5, rounds=3, size=4000, flag_bytes=8, start_s=1.5, qp=7)
    assert len(messages) == 2 * 5 * 3
    for data, flag in zip(messages[::2], messages[1::2], strict=True):
        assert flag.id == data.id + 1
        assert (data.op, data.tag, data.bytes) == ("write", "data", 4000)
        assert (flag.op, flag.tag, flag.bytes) == ("send", "flag", 8)
        assert (data.src, data.dst) == (flag.src, flag.dst)
        assert (data.qp, data.start_s) == (flag.qp, flag.start_s) == (7, 1.5)
        assert data.deps == flag.deps == ()
    assert Counter((m.src, m.dst) for m in messages) == {pair: 6 for pair in {(m.src, m.dst) for m in messages}}


def test_write_flag_defaults_cross_leaves_within_a_plane(fabric):
    messages = patterns.generate("write-flag", fabric)
    assert {m.src for m in messages} == set(patterns.compute_hosts(fabric))
    for m in messages:
        a, b = fabric.node(m.src), fabric.node(m.dst)
        assert a["plane"] == b["plane"] and a["node"] != b["node"]
        assert fabric.nic_links(m.src)[0][0] != fabric.nic_links(m.dst)[0][0]


def test_write_flag_refusals(fabric):
    with pytest.raises(UserError) as err:
        patterns.write_flag(fabric, pairs=33)
    assert err.value.field == "pairs"
    with pytest.raises(UserError) as err:
        patterns.write_flag(fabric, shift=16, plane=1)
    assert err.value.field == "shift"
    with pytest.raises(UserError) as err:
        patterns.check_params("write-flag", {"rounds": 0})
    assert err.value.field == "rounds"

"""Chakra execution traces: the ASTRA-sim examples (a ring all-reduce collective and an MSCCL send/recv ring),
synthetic traces encoded here, and bad or random bytes as one-line UserErrors naming file, record and field."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator.model.errors import UserError
from emulator.model.schedule import check
from emulator.model.topologies import build
from tests.traces import TRACES, needs_traces
from traffic import chakra, chakra_wire

GPUS = build("mpft", planes=2, nodes=16).hosts(role="gpu")
MiB = 1 << 20


# -- a minimal protobuf encoder for synthetic traces ------------------------------------------------------
def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def fld(number: int, value: int | bytes | str) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    value = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(value)) + value


def attr(name: str, value: int) -> bytes:
    return fld(10, fld(1, name) + fld(9, value))  # int64_val


def node(nid: int, ntype: int, deps=(), duration: int = 0, packed: bool = True, **attrs: int) -> bytes:
    body = fld(1, nid) + fld(2, f"n{nid}") + fld(3, ntype)
    if deps:
        body += fld(5, b"".join(map(varint, deps))) if packed else b"".join(fld(5, d) for d in deps)
    body += fld(7, duration) if duration else b""
    return body + b"".join(attr(k, v) for k, v in attrs.items())


def et(*nodes: bytes) -> bytes:
    records = [fld(1, "0.0.4"), *nodes]
    return b"".join(varint(len(r)) + r for r in records)


def write(tmp_path: Path, *ranks: bytes) -> list[Path]:
    paths = []
    for r, data in enumerate(ranks):
        paths.append(tmp_path / f"t.{r}.et")
        paths[-1].write_bytes(data)
    return paths


def load_error(paths, hosts=GPUS) -> UserError:
    with pytest.raises(UserError) as info:
        chakra.load(paths, hosts)
    assert "\n" not in str(info.value)
    return info.value


def ancestors(messages, mid: int) -> set[int]:
    by_id = {m.id: m for m in messages}
    seen, todo = set(), list(by_id[mid].deps)
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo += by_id[d].deps
    return seen


# -- the ASTRA-sim examples --------------------------------------------------------------------------------
@needs_traces
def test_all_reduce_4npus_expands_to_a_ring():
    result = chakra.load(TRACES / "astrasim_all_reduce_4npus_1MB", GPUS)
    n = 4
    assert result.collectives == {"ALL_REDUCE": 1} and len(result.messages) == 2 * (n - 1) * n
    check(result.messages, GPUS)
    for r in range(n):
        sent = [m for m in result.messages if m.src == GPUS[r]]
        assert {m.dst for m in sent} == {GPUS[(r + 1) % n]}
        assert sum(m.bytes for m in sent) == 2 * (n - 1) * MiB // n
    for m in result.messages[n:]:  # every later step waits for what its sender sent and received last step
        assert len(m.deps) == 2 and all(d == m.id - n or result.messages[d].dst == m.src for d in m.deps)
    files = [TRACES / f"astrasim_all_reduce_4npus_1MB.{r}.et" for r in range(n)]
    assert chakra.load(files, GPUS).messages == result.messages


@needs_traces
def test_msccl_ring_matches_sends_to_recvs_through_compute():
    result = chakra.load(TRACES / "astrasim_custom_allreduce_8npus_1MB", GPUS)
    assert result.ranks == 8 and result.matched_sends == 8 * 14 and not result.unmatched and not result.skipped
    assert result.node_types == {"COMM_SEND_NODE": 112, "COMM_RECV_NODE": 112, "COMP_NODE": 56}
    check(result.messages, GPUS)
    for host in GPUS[:8]:
        sent = [m for m in result.messages if m.src == host]
        assert len(sent) == 14 and all(m.bytes == 131072 and m.op == "send" for m in sent)
        assert len({m.dst for m in sent}) == 1 and sum(m.dst == host for m in result.messages) == 14
        for before, after in zip(sent, sent[1:], strict=False):  # the rank's chain survives the compute nodes
            assert before.id in ancestors(result.messages, after.id)
    assert max(m.start_s for m in result.messages) == pytest.approx(7 * 7e-6)  # 7 compute nodes of 7 us


@needs_traces
def test_more_ranks_than_hosts_and_missing_rank_files(tmp_path):
    assert "8 ranks but only 4" in str(load_error(TRACES / "astrasim_custom_allreduce_8npus_1MB", GPUS[:4]))
    for r in (0, 1, 3):
        shutil.copy(TRACES / f"astrasim_all_reduce_4npus_1MB.{r}.et", tmp_path / f"ar.{r}.et")
    assert "ar.2.et" in str(load_error(tmp_path / "ar"))
    assert "no Chakra trace files" in str(load_error(tmp_path / "nothing"))


# -- synthetic traces ----------------------------------------------------------------------------------------
def test_compute_delays_dependents_and_passes_dependencies_through(tmp_path):
    rank0 = et(node(0, 5, comm_dst=1, comm_size=100, comm_tag=7), node(1, 4, [0], duration=5, packed=False),
               node(2, 5, [1], comm_dst=1, comm_size=200, comm_tag=7),
               node(3, 6, [2], comm_src=1, comm_size=300, comm_tag=1))
    rank1 = et(node(0, 6, comm_src=0, comm_size=100, comm_tag=7),
               node(1, 6, [0], comm_src=0, comm_size=200, comm_tag=7),  # same tag: matched in node order
               node(2, 5, [1], comm_dst=0, comm_size=300, comm_tag=1))
    result = chakra.load(write(tmp_path, rank0, rank1), GPUS)
    first, second, reply = result.messages
    assert (first.bytes, second.bytes, reply.bytes) == (100, 200, 300)
    assert second.deps == (first.id,) and second.start_s == pytest.approx(5e-6)  # through the compute node
    assert set(reply.deps) == {first.id, second.id} and (reply.src, reply.dst) == (GPUS[1], GPUS[0])
    assert result.matched_sends == 3 and not result.unmatched and not result.skipped
    check(result.messages, GPUS)


def test_unmatched_and_unsupported_nodes_are_reported(tmp_path):
    rank0 = et(node(0, 7, comm_type=5, comm_size=64), node(1, 5, [0], comm_dst=1, comm_size=10, comm_tag=3),
               node(2, 7, [1], comm_type=6, comm_size=64))
    rank1 = et(node(0, 7, comm_type=5, comm_size=64), node(1, 7, [0], comm_type=6, comm_size=64),
               node(2, 6, [1], comm_src=0, comm_size=10, comm_tag=4))
    result = chakra.load(write(tmp_path, rank0, rank1), GPUS)
    assert result.skipped == {"BROADCAST not supported": 2, "unmatched send/recv": 2}
    assert result.collectives == {"ALL_TO_ALL": 1} and len(result.messages) == 2
    assert sorted(result.unmatched) == ["rank 0 node 1: send to rank 1 tag 3", "rank 1 node 2: recv from rank 0 tag 4"]
    assert all(not m.deps for m in result.messages)  # nothing before them carries traffic
    check(result.messages, GPUS)


def test_reduce_scatter_and_all_gather_take_n_minus_1_steps(tmp_path):
    ranks = [et(node(0, 7, comm_type=7, comm_size=300), node(1, 7, [0], comm_type=2, comm_size=300))] * 3
    result = chakra.load(write(tmp_path, *ranks), GPUS)
    assert result.collectives == {"REDUCE_SCATTER": 1, "ALL_GATHER": 1}
    assert len(result.messages) == 2 * 2 * 3 and {m.bytes for m in result.messages} == {100}
    rs_last = [m.id for m in result.messages[3:6]]
    assert all(set(m.deps) & set(rs_last) for m in result.messages[6:9])  # all-gather after reduce-scatter
    check(result.messages, GPUS)


@pytest.mark.parametrize("data, field, words", [
    (b"\x80", None, ["record 0", "truncated varint", "byte 0"]),
    (b"\x0a\x01", None, ["record 0", "truncated message"]),
    (et(node(0, 5, comm_dst=1, comm_size=-1, comm_tag=0)), "comm_size", ["record 1", ">= 0", "-1"]),
    (et(node(0, 7, comm_size=8)), "comm_type", ["record 1", "missing"]),
    (et(node(0, 5, comm_dst=9, comm_size=8, comm_tag=0)), "comm_dst", ["record 1", "0..1"]),
    (et(varint(3 << 3 | 3)), None, ["record 1", "wire type 3"]),
    (et(varint(3 << 3 | 7) + b"\x00"), None, ["wire type 7"]),
    (et(fld(3, b"xx")), "type", ["record 1", "wire type 2"]),
    (et(fld(2, b"\xff\xfe")), "name", ["utf-8"]),
    (et(node(0, 4, [5])), "data_deps", ["record 1", "node 5", "not in this file"]),
    (et(node(0, 4, [1]), node(1, 4, [0])), "data_deps", ["cycle"]),
    (et(node(0, 4), node(0, 4)), "id", ["record 2", "already used by record 1"]),
    (et(fld(10, fld(1, "x") + varint(3 << 3 | 1) + b"\x00\x00")), "attr", ["record 1", "truncated 64-bit"]),
    (b"", None, ["no GlobalMetadata"]),
    (et(node(0, 4)), None, ["no communication"]),
])
def test_bad_traces_name_file_record_and_field(tmp_path, data, field, words):
    paths = write(tmp_path, data, et(node(0, 4)))
    err = load_error(paths)
    assert err.file == str(paths[0]) and err.field == field
    for word in words:
        assert word in str(err)


def test_unknown_fields_are_skipped_and_unpacked_deps_accepted(tmp_path):
    extra = fld(99, b"future") + fld(98, 5) + varint(97 << 3 | 5) + b"\0\0\0\0" + varint(96 << 3 | 1) + b"\0" * 8
    ranks = [et(node(0, 4, duration=3) + extra, node(1, 7, [0], packed=False, comm_type=0, comm_size=8))] * 2
    result = chakra.load(write(tmp_path, *ranks), GPUS)
    assert len(result.messages) == 4 and all(m.start_s == pytest.approx(3e-6) for m in result.messages)


# -- fuzz --------------------------------------------------------------------------------------------------
SEED = [et(node(0, 5, comm_dst=1, comm_size=100, comm_tag=7), node(1, 4, [0], duration=5),
           node(2, 7, [1], comm_type=0, comm_size=64)),
        et(node(0, 6, comm_src=0, comm_size=100, comm_tag=7), node(1, 7, [0], comm_type=0, comm_size=64))]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def only_user_errors(paths) -> None:
    try:
        result = chakra.load(paths, GPUS)
    except UserError as exc:
        assert "\n" not in str(exc)
    else:
        check(result.messages, GPUS)


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes_give_only_user_errors(tmp_path, data):
    only_user_errors(write(tmp_path, data, SEED[1]))


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
       cut=st.integers(0, 10_000), rank=st.integers(0, 1))
def test_mutated_traces_give_only_user_errors(tmp_path, edits, cut, rank):
    data = bytearray(SEED[rank])
    for at, byte in edits:
        data[at % len(data)] = byte
    ranks = list(SEED)
    ranks[rank] = bytes(data[:max(1, cut % (len(data) + 1))])
    only_user_errors(write(tmp_path, *ranks))


def test_attribute_kinds_decode(tmp_path):
    values = (fld(10, fld(1, "a") + fld(9, -1)) + fld(10, fld(1, "b") + fld(17, 5))
              + fld(10, fld(1, "c") + varint(3 << 3 | 1) + struct.pack("<d", 2.5))
              + fld(10, fld(1, "d") + fld(29, "text")) + fld(10, fld(1, "e") + fld(10, fld(1, varint(3) + varint(-2))))
              + fld(10, fld(1, "f") + fld(28, fld(1, 1) + fld(1, 0))))
    path = write(tmp_path, et(node(0, 4) + values))[0]
    _meta, [(record, decoded)] = chakra_wire.read_records(path)
    assert record == 1 and {a["name"]: a["value"] for a in decoded["attr"]} == {
        "a": -1, "b": -3, "c": 2.5, "d": "text", "e": {"values": [3, -2]}, "f": {"values": [True, False]}}

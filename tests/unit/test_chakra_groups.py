"""Chakra process groups: collectives span their group's ranks, defined by the trace's process-group metadata or
by a communicator-group file. The traces are written by the protobuf package (tests/chakra_proto.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from emulator.cli.main import main
from emulator.model.errors import UserError
from emulator.model.schedule import check
from emulator.model.topologies import build
from emulator.study import runner, scenario
from tests.chakra_proto import ALL_REDUCE, TP, coll, pg_init, tp_then_world, write_ranks
from traffic import chakra

GPUS = build("mpft", planes=2, nodes=16).hosts(role="gpu")


def test_a_collective_spans_its_process_group(tmp_path):
    result = chakra.load(write_ranks(tmp_path, [tp_then_world(r) for r in range(8)]), GPUS)
    check(result.messages, GPUS)
    assert result.collectives == {"ALL_REDUCE": 2, "ALL_TO_ALL": 1}
    assert result.groups == {"1": (0, 1, 2, 3), "2": (4, 5, 6, 7), "0": tuple(range(8))}
    assert "process groups 0 (ranks 0-7), 1 (ranks 0-3), 2 (ranks 4-7)" in result.summary()
    reduce = [m for m in result.messages if m.tag == "coll2"]
    a2a = [m for m in result.messages if m.tag == "coll3"]
    assert len(reduce) == 2 * 2 * 3 * 4 and {m.bytes for m in reduce} == {1000}  # 2 groups, 2(N-1) steps, N ranks
    for members in TP.values():
        hosts = [GPUS[r] for r in members]
        ring = {(m.src, m.dst) for m in reduce if m.src in hosts}
        assert ring == {(hosts[i], hosts[(i + 1) % 4]) for i in range(4)}  # the group's own ring, nobody else
    assert len(a2a) == 8 * 7 and {m.bytes for m in a2a} == {1000}
    assert {(m.src, m.dst) for m in a2a} == {(GPUS[a], GPUS[b]) for a in range(8) for b in range(8) if a != b}
    last_reduce = {GPUS[r]: max(m.id for m in reduce if m.src == GPUS[r]) for r in range(8)}
    assert all(last_reduce[m.src] in m.deps for m in a2a)  # the world's all-to-all waits for the rank's own group
    assert all(m.start_s == pytest.approx(5e-6) for m in result.messages)


def test_a_communicator_group_file_defines_the_groups_as_the_metadata_does(tmp_path):
    from_trace = chakra.load(write_ranks(tmp_path, [tp_then_world(r) for r in range(8)]), GPUS)
    plain = tmp_path / "plain"
    plain.mkdir()
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps(TP))
    from_file = chakra.load(write_ranks(plain, [tp_then_world(r, with_metadata=False) for r in range(8)]), GPUS,
                            comm_groups=groups)
    assert from_file.messages == from_trace.messages


def test_a_group_of_scattered_ranks_rings_in_its_own_order(tmp_path):
    groups = {"7": [6, 0, 4, 2]}
    ranks = [[pg_init(0, groups), coll(1, ALL_REDUCE, 400, [0], pg="7")] if r % 2 == 0 else [pg_init(0, groups)]
             for r in range(8)]
    result = chakra.load(write_ranks(tmp_path, ranks), GPUS)
    order = [GPUS[r] for r in groups["7"]]
    assert {(m.src, m.dst) for m in result.messages} == {(order[i], order[(i + 1) % 4]) for i in range(4)}
    assert "process groups 7 (ranks 6,0,4,2)" in result.summary()


def test_surplus_collectives_of_a_group_are_reported(tmp_path):
    ranks = [tp_then_world(r) for r in range(8)]
    ranks[5].append(coll(4, ALL_REDUCE, 4000, [3], pg="2"))
    result = chakra.load(write_ranks(tmp_path, ranks), GPUS)
    assert result.unmatched == ["rank 5 node 4: collective #2 of process group '2' has no partner on every rank of "
                                "its group"]
    assert result.collectives == {"ALL_REDUCE": 2, "ALL_TO_ALL": 1}


def error(tmp_path: Path, ranks: list[list], groups: object = None) -> UserError:
    path = None
    if groups is not None:
        path = tmp_path / "groups.json"
        path.write_text(groups if isinstance(groups, str) else json.dumps(groups))
    with pytest.raises(UserError) as info:
        chakra.load(write_ranks(tmp_path, ranks), GPUS, comm_groups=path)
    assert "\n" not in str(info.value)
    return info.value


def test_bad_groups_are_one_line_naming_file_and_field(tmp_path):
    plain = [tp_then_world(r, with_metadata=False) for r in range(8)]
    err = error(tmp_path, plain)
    assert err.field == "pg_name" and err.file.endswith("pg.0.et") and "'1' is not defined" in str(err)
    err = error(tmp_path, plain, {"1": [0, 1, 2], "2": [4, 5, 6, 7]})
    assert err.field == "pg_name" and err.file.endswith("pg.3.et") and "rank 3 is not in process group '1'" in str(err)
    err = error(tmp_path, plain, {"1": [0, 1, 2, 9], "2": [4, 5, 6, 7]})
    assert err.field == "1" and err.file.endswith("groups.json") and "rank 9, but the trace has 8" in str(err)
    err = error(tmp_path, plain, {"1": "0-3"})
    assert err.field == "1" and "list of distinct ranks" in str(err)
    err = error(tmp_path, plain, '{"1": [0, 1,')
    assert err.file.endswith("groups.json") and err.line == 1 and "invalid JSON" in str(err)
    err = error(tmp_path, [tp_then_world(r) for r in range(8)], {"1": [0, 1], "2": [4, 5, 6, 7]})
    assert err.field == "1" and "has ranks 0,1, but pg.0.et record 1 (process_group:init) gave 0-3" in str(err)
    bad = [tp_then_world(r) for r in range(8)]
    bad[2][0].inputs.values = "['[{\"ranks\": [0]}]']"
    err = error(tmp_path, bad)
    assert err.field == "inputs" and err.file.endswith("pg.2.et") and "record 1" in str(err)


def test_a_study_reads_comm_groups_beside_its_trace(tmp_path):
    write_ranks(tmp_path, [tp_then_world(r, with_metadata=False) for r in range(8)])
    (tmp_path / "groups.json").write_text(json.dumps(TP))
    text = ('name = "g"\nseeds = [1]\n[topology]\nplanes = 2\nnodes = 8\n[[traffic]]\ntrace = "pg"\n'
            'comm_groups = "groups.json"\n[[variants]]\nname = "ecmp"\napp = "ecmp"\n')
    (tmp_path / "s.toml").write_text(text)
    study = scenario.load(str(tmp_path / "s.toml"))
    assert study.traffic[0].comm_groups == (tmp_path / "groups.json").resolve()
    fabric = build("mpft", planes=2, nodes=8)
    messages = runner.traffic_item(study.traffic[0], fabric, seed=1)
    gpus = fabric.hosts(role="gpu")
    assert len(messages) == 2 * 2 * 3 * 4 + 8 * 7
    assert all(gpus.index(m.src) // 4 == gpus.index(m.dst) // 4 for m in messages if m.tag == "coll2")
    for wrong, words in (('comm_groups = "absent.json"', "no such file 'absent.json'"),
                         ('comm_groups = "groups.json"\nformat = "jsonl"', "only a Chakra trace")):
        (tmp_path / "s.toml").write_text(text.replace('comm_groups = "groups.json"', wrong))
        with pytest.raises(UserError) as info:
            scenario.load(str(tmp_path / "s.toml"))
        assert info.value.field == "traffic[0].comm_groups" and words in str(info.value)


@pytest.mark.parametrize("groups, words", [('{"1": [0, 1', "groups.json:1: invalid JSON"),
                                           ('{"1": [0, 1, 2, 3]}', "pg.4.et: pg_name: ")])
def test_replay_with_bad_groups_is_one_line_exit_2(tmp_path, capsys, groups, words):
    write_ranks(tmp_path, [tp_then_world(r, with_metadata=False) for r in range(8)])
    (tmp_path / "groups.json").write_text(groups)
    assert main(["replay", str(tmp_path / "pg"), "--comm-groups", str(tmp_path / "groups.json")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and words in err

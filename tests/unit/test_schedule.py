"""The JSON Lines trace format: round trip, and every bad input is a UserError naming file, line and field."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator.model import schedule
from emulator.model.errors import UserError
from emulator.model.schedule import Message

HOSTS = ["h1", "h2", "h3"]
GOOD = {"id": 1, "start_s": 0.0, "src": "h1", "dst": "h2", "bytes": 1000}


def _write_lines(path, lines) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def _error(tmp_path, lines, hosts=None) -> str:
    path = _write_lines(tmp_path / "trace.jsonl", lines)
    with pytest.raises(UserError) as info:
        schedule.read(path, hosts)
    return str(info.value)


def test_round_trip(tmp_path):
    messages = [
        Message(0, 0.0, "h1", "h2", 1),
        Message(5, 0.25, "h2", "h1", 65536, tclass=7, qp=schedule.MAX_QP, op="send", tag="dispatch"),
        Message(2, 1e-6, "h1", "h3", 123, deps=(0, 5), tag="ring"),
    ]
    path = schedule.write(tmp_path / "t.jsonl", messages)
    assert schedule.read(path, HOSTS) == messages
    assert schedule.hosts_of(messages) == HOSTS


def test_comments_and_blank_lines_are_skipped_and_lines_counted(tmp_path):
    text = _error(tmp_path, ["# a comment", "", GOOD, "   ", {**GOOD, "id": 2, "bytes": 0}])
    assert text.startswith(f"{tmp_path / 'trace.jsonl'}:5: bytes: ")


def test_defaults(tmp_path):
    [msg] = schedule.read(_write_lines(tmp_path / "t.jsonl", [GOOD]))
    assert (msg.tclass, msg.qp, msg.deps, msg.op, msg.tag) == (0, 1, (), "write", "")


BAD_LINES = [
    ({k: v for k, v in GOOD.items() if k != "bytes"}, "bytes"),
    ({k: v for k, v in GOOD.items() if k != "src"}, "src"),
    ({**GOOD, "size": 3}, "size"),
    ({**GOOD, "bytes": -1}, "bytes"),
    ({**GOOD, "bytes": 0}, "bytes"),
    ({**GOOD, "bytes": 1.5}, "bytes"),
    ({**GOOD, "id": True}, "id"),
    ({**GOOD, "id": -1}, "id"),
    ({**GOOD, "dst": "h1"}, "dst"),
    ({**GOOD, "src": ""}, "src"),
    ({**GOOD, "tclass": 8}, "tclass"),
    ({**GOOD, "qp": 0}, "qp"),
    ({**GOOD, "qp": schedule.MAX_QP + 1}, "qp"),
    ({**GOOD, "start_s": -0.5}, "start_s"),
    ({**GOOD, "start_s": "soon"}, "start_s"),
    ({**GOOD, "start_s": 10 ** 400}, "start_s"),
    ('{"id": 1, "start_s": NaN, "src": "h1", "dst": "h2", "bytes": 1}', "start_s"),
    ('{"id": 1, "start_s": Infinity, "src": "h1", "dst": "h2", "bytes": 1}', "start_s"),
    ({**GOOD, "op": "read"}, "op"),
    ({**GOOD, "tag": 3}, "tag"),
    ({**GOOD, "deps": 0}, "deps"),
    ({**GOOD, "deps": [True]}, "deps"),
]


@pytest.mark.parametrize(("line", "field"), BAD_LINES)
def test_bad_message_names_file_line_and_field(tmp_path, line, field):
    text = _error(tmp_path, [{**GOOD, "id": 0}, line])
    assert text.startswith(f"{tmp_path / 'trace.jsonl'}:2: {field}: ")


@pytest.mark.parametrize(("lines", "field"), [
    ([GOOD, {**GOOD, "dst": "h3"}], "id"),
    ([GOOD, {**GOOD, "id": 2, "deps": [3]}, {**GOOD, "id": 3}], "deps"),
    ([GOOD, {**GOOD, "id": 2, "deps": [2]}], "deps"),
    ([GOOD, {**GOOD, "id": 2, "src": "h3", "dst": "h1", "deps": [1]}], "deps"),
])
def test_bad_schedule_names_file_line_and_field(tmp_path, lines, field):
    text = _error(tmp_path, lines)
    assert text.startswith(f"{tmp_path / 'trace.jsonl'}:2: {field}: ")


def test_dependency_seen_by_the_receiver_side_is_allowed(tmp_path):
    path = _write_lines(tmp_path / "t.jsonl", [GOOD, {**GOOD, "id": 2, "src": "h2", "dst": "h3", "deps": [1]}])
    assert [m.deps for m in schedule.read(path)] == [(), (1,)]


@pytest.mark.parametrize("field", ["src", "dst"])
def test_unknown_host_when_hosts_are_given(tmp_path, field):
    lines = [GOOD, {**GOOD, "id": 2, field: "h9"}]
    assert schedule.read(_write_lines(tmp_path / "ok.jsonl", lines))  # no fabric to check against
    text = _error(tmp_path, lines, HOSTS)
    assert text.startswith(f"{tmp_path / 'trace.jsonl'}:2: {field}: ") and "h9" in text


@pytest.mark.parametrize("line", ["{not json", '{"id": 1,}', "[1, 2", "1" * 5000, "[" * 100_000])
def test_invalid_json_names_file_and_line(tmp_path, line):
    text = _error(tmp_path, [GOOD, line])
    assert text.startswith(f"{tmp_path / 'trace.jsonl'}:2: ")


def test_not_an_object(tmp_path):
    assert _error(tmp_path, [GOOD, "[1, 2]"]).startswith(f"{tmp_path / 'trace.jsonl'}:2: ")


def test_line_numbers_count_newlines_only(tmp_path):
    """Form feeds and Unicode line separators are not line ends in JSON Lines (U+2028 may sit inside a string)."""
    path = tmp_path / "trace.jsonl"
    path.write_text('\x0c\n{"id": 1, "start_s": 0, "src": "h1", "dst": "h2", "bytes": 1, "tag": "a\u2028b"}\n'
                    '{"id": 2, "start_s": 0, "src": "h1", "dst": "h2", "bytes": 0}\n')
    with pytest.raises(UserError) as info:
        schedule.read(path)
    assert str(info.value).startswith(f"{path}:3: bytes: ")
    path.write_bytes(b'{"id": 1, "start_s": 0, "src": "h1", "dst": "h2", "bytes": 1}\r\n\r\n{"id": 1}\r\n')
    with pytest.raises(UserError) as info:
        schedule.read(path)
    assert str(info.value).startswith(f"{path}:3: start_s: ")


def test_empty_and_unreadable_traces(tmp_path):
    assert _error(tmp_path, ["# nothing", ""]).startswith(f"{tmp_path / 'trace.jsonl'}: ")
    with pytest.raises(UserError, match="cannot read"):
        schedule.read(tmp_path / "missing.jsonl")
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError, match="cannot read"):
        schedule.read(tmp_path / "binary.jsonl")


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.text(max_size=80), max_size=5))
def test_random_text_is_a_user_error_or_a_schedule(tmp_path, lines):
    path = tmp_path / "fuzz.jsonl"
    path.write_text("\n".join(lines))
    try:
        schedule.read(path)
    except UserError:
        pass


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3),
                    lambda children: st.lists(children, max_size=2) | st.dictionaries(st.text(max_size=3), children,
                                                                                       max_size=2), max_leaves=3)
VALUES = {"id": st.integers(-1, 3), "start_s": st.floats() | st.integers(), "src": st.sampled_from(HOSTS),
          "dst": st.sampled_from(HOSTS), "bytes": st.integers(), "tclass": st.integers(-1, 8), "qp": st.integers(),
          "deps": st.lists(st.integers(-1, 3), max_size=2), "op": st.sampled_from(schedule.OPS),
          "tag": st.text(max_size=3)}
REQUIRED = ("id", "start_s", "src", "dst", "bytes")
MESSAGE_LIKE = st.fixed_dictionaries({k: VALUES[k] | JSON for k in REQUIRED},
                                     optional={k: v | JSON for k, v in VALUES.items() if k not in REQUIRED}
                                     | {"extra": JSON})


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(objs=st.lists(MESSAGE_LIKE, min_size=1, max_size=4))
def test_message_like_objects_are_a_user_error_or_a_valid_schedule(tmp_path, objs):
    path = tmp_path / "fuzz.jsonl"
    path.write_text("".join(json.dumps(obj) + "\n" for obj in objs))
    try:
        messages = schedule.read(path, HOSTS)
    except UserError as exc:
        assert exc.file == str(path) and exc.line is not None
        return
    assert len(messages) == len(objs)
    assert schedule.read(schedule.write(tmp_path / "again.jsonl", messages), HOSTS) == messages

"""HPCC ns-3 inputs: the shipped flow file (N=2 over 256 lines), CRLF topologies, the flow-size CDFs, the Poisson
generator, and bad input as one-line UserErrors naming file, line and field."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator.model.errors import UserError
from emulator.model.schedule import check
from emulator.model.topologies import build
from tests.traces import TRACES, needs_traces
from traffic import hpcc

GPUS = build("mpft", planes=2, nodes=16).hosts(role="gpu")


def _file(tmp_path: Path, text: str, name: str = "flow.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(call, *args) -> UserError:
    with pytest.raises(UserError) as info:
        call(*args)
    return info.value


@needs_traces
def test_shipped_flow_file_reads_n_flows_and_reports_the_rest():
    result = hpcc.read_flows(TRACES / "hpcc_mix_flow.txt", GPUS)
    assert result.flows_read == 2 and len(result.messages) == 2
    assert result.lines_ignored >= 256  # 254 further flows and the format explanation
    assert result.host_of == {1: GPUS[0], 2: GPUS[1], 3: GPUS[2]}  # distinct ids, sorted, onto the GPUs
    first, second = result.messages
    assert (first.src, first.dst, first.bytes, first.tclass, first.start_s) == (GPUS[1], GPUS[0], 200_000_000, 3, 0)
    assert second.src == GPUS[2] and first.qp != second.qp
    assert "254" not in result.summary() and "ignored" in result.summary()


@needs_traces
def test_topology_files_parse_with_crlf():
    star = hpcc.read_topology(TRACES / "hpcc_mix_topology.txt")
    assert (star.nodes, star.switches, len(star.links)) == (66, {0}, 65)
    assert star.links[0] == hpcc.Link(0, 1, 100e9, 1e-6, 0.0)
    assert star.lines_ignored > 190  # the 191 extra links and the explanation are never read
    fat = hpcc.read_topology(TRACES / "hpcc_mix_fat.txt")
    assert (fat.nodes, len(fat.switches), len(fat.links), fat.lines_ignored) == (376, 56, 480, 0)
    assert sorted(link.bps for link in fat.links) == [100e9] * 320 + [400e9] * 160
    assert fat.host_ids == list(range(320))


@needs_traces
def test_topology_fixes_the_mapping_and_rejects_switch_ids(tmp_path):
    fat = hpcc.read_topology(TRACES / "hpcc_mix_fat.txt")
    result = hpcc.read_flows(TRACES / "hpcc_mix_flow.txt", GPUS, fat)
    assert [(m.src, m.dst) for m in result.messages] == [(GPUS[2], GPUS[1]), (GPUS[3], GPUS[1])]
    err = _error(hpcc.read_flows, _file(tmp_path, "1\n0 320 3 100 1000 2\n"), GPUS, fat)
    assert err.line == 2 and err.field == "dst" and "not a host" in str(err)


def test_ids_without_host_drop_their_flows_and_are_reported(tmp_path):
    lines = [f"{i} {i + 1} 3 100 1000 {i}" for i in range(40)]
    result = hpcc.read_flows(_file(tmp_path, f"40\n{chr(10).join(lines)}\n"), GPUS)
    assert len(result.messages) == 31 and result.flows_dropped == 9
    assert result.ids_without_host == list(range(32, 41))
    assert result.messages[0].start_s == 0 and result.messages[-1].start_s == 30
    assert "node ids without a host: 32, 33" in result.summary()
    check(result.messages, GPUS)
    err = _error(hpcc.read_flows, _file(tmp_path, "1\n50 51 3 100 1000 0\n"), GPUS[:1])
    assert "no flow has both ends" in str(err) and "without a host: 51" in str(err)


def test_pg_becomes_the_traffic_class_clipped_to_7(tmp_path):
    result = hpcc.read_flows(_file(tmp_path, "2\r\n0 1 0 100 10 0\r\n1 0 9 100 10 0.5\r\n"), GPUS)
    assert [m.tclass for m in result.messages] == [0, 7] and result.pg_clipped == 1


@pytest.mark.parametrize("text, line, field", [
    ("2\n0 1 3 100 1000 1\n0 1 x 100 1000 2\n", 3, "pg"),
    ("1\n0 1 3 100 -5 1\n", 2, "size"),
    ("1\n0 1 3 100 0 1\n", 2, "size"),
    ("1\n0 0 3 100 10 1\n", 2, "dst"),
    ("1\n0 1 3 100 10 nan\n", 2, "start_time"),
    ("1\n0 1 3 100 10 1e999\n", 2, "start_time"),
    ("2\n0 1 3 100 10 2\n1 0 3 100 10 1\n", 3, "start_time"),
    ("3\n0 1 3 100 10 2\n1 0 3 100\n", 3, "size"),
    ("0\n", 1, "flow count"),
    ("two\n", 1, "flow count"),
])
def test_bad_flow_files_name_file_line_and_field(tmp_path, text, line, field):
    path = _file(tmp_path, text)
    err = _error(hpcc.read_flows, path, GPUS)
    assert (err.file, err.line, err.field) == (str(path), line, field)
    assert str(err).startswith(f"{path}:{line}: {field}: ") and "\n" not in str(err)


def test_bad_topology_names_the_line(tmp_path):
    path = _file(tmp_path, "3 1 2\r\n2\r\n0 2 100Gbps 1us 0\r\n1 2 fastGbps 1us 0\r\n", "topology.txt")
    err = _error(hpcc.read_topology, path)
    assert (err.line, err.field) == (4, "rate")
    err = _error(hpcc.read_topology, _file(tmp_path, "3 1 1\n5\n", "t.txt"))
    assert (err.line, err.field) == (2, "switch id")


CDFS = {  # file, points, mean (SOURCES.md, trapezoidal)
    "WebSearch": ("hpcc_cdf_WebSearch_distribution.txt", 12, 1.71e6),
    "FbHdp": ("hpcc_cdf_FbHdp_distribution.txt", 20, 120e3),
    "AliStorage": ("hpcc_cdf_AliStorage2019.txt", 9, 40.9e3),
    "GoogleRPC": ("hpcc_cdf_GoogleRPC2008.txt", 843, 2.9e3),
}


@needs_traces
@pytest.mark.parametrize("name", CDFS)
def test_cdf_means_match_sources(name):
    filename, points, mean = CDFS[name]
    cdf = hpcc.read_cdf(TRACES / filename)
    assert len(cdf.points) == points and cdf.points[0] == (0, 0) and cdf.points[-1][1] == 100
    assert cdf.mean == pytest.approx(mean, rel=0.01)


@needs_traces
def test_sample_sizes_interpolate_the_cdf():
    cdf = hpcc.read_cdf(TRACES / CDFS["WebSearch"][0])
    sizes = hpcc.sample_sizes(cdf, 40_000, seed=7)
    assert sizes == hpcc.sample_sizes(cdf, 40_000, seed=7)
    assert 1 <= min(sizes) and max(sizes) <= 30_000_000
    assert sum(s <= 10_000 for s in sizes) / len(sizes) == pytest.approx(0.15, abs=0.01)
    assert sum(s <= 15_000 for s in sizes) / len(sizes) == pytest.approx(0.175, abs=0.01)  # halfway 15 % .. 20 %
    assert statistics.mean(sizes) == pytest.approx(cdf.mean, rel=0.05)


@needs_traces
def test_poisson_generator_offers_the_target_load():
    cdf = hpcc.read_cdf(TRACES / CDFS["AliStorage"][0])
    messages = hpcc.generate(cdf, GPUS, load=0.5, host_bps=100e9, duration_s=0.005, seed=3)
    check(messages, GPUS)
    assert messages == hpcc.generate(cdf, GPUS, load=0.5, host_bps=100e9, duration_s=0.005, seed=3)
    assert all(0 <= m.start_s <= 0.005 and m.src != m.dst for m in messages)
    assert [m.start_s for m in messages] == sorted(m.start_s for m in messages)
    offered = sum(m.bytes for m in messages) * 8 / 0.005 / (len(GPUS) * 100e9)
    assert offered == pytest.approx(0.5, rel=0.05)
    assert {m.src for m in messages} == set(GPUS) == {m.dst for m in messages}
    with pytest.raises(UserError):
        hpcc.generate(cdf, GPUS, load=1.5, host_bps=100e9, duration_s=1)


@pytest.mark.parametrize("text, line", [
    ("10 0\n5 100\n", 2), ("0 0\n100 90\n", None), ("0 5\n100 100\n", 1), ("0 0\n100 50 7\n", 2), ("0 0\nx 100\n", 2),
])
def test_bad_cdf(tmp_path, text, line):
    err = _error(hpcc.read_cdf, _file(tmp_path, text, "cdf.txt"))
    assert err.file.endswith("cdf.txt") and err.line == line


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.sampled_from("0123456789 .-+e\n\r\tx") | st.characters(), max_size=300),
       raw=st.binary(max_size=64))
def test_fuzzed_text_gives_only_user_errors(tmp_path, text, raw):
    path = tmp_path / "fuzz.txt"
    for content in (text.encode("utf-8", "surrogatepass"), raw, ("3\n" + text).encode("utf-8", "surrogatepass")):
        path.write_bytes(content)
        for parse in (lambda p: hpcc.read_flows(p, GPUS), hpcc.read_topology, hpcc.read_cdf):
            try:
                parse(path)
            except UserError as exc:
                assert exc.file == str(path) and "\n" not in str(exc)

"""`mpft topo`: counts as JSON, one-line errors with exit code 2, and save/load of the model."""

from __future__ import annotations

import json

import pytest

from emulator.cli.main import build_parser, main


def _topo_json(capsys, *args):
    assert main(["topo", *args, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return json.loads(out)


@pytest.mark.parametrize("args, hosts, switches, links", [
    (["--topo", "ft2", "--k", "64"], 64**2 // 2, 3 * 64 // 2, 64**2 // 2),
    (["--topo", "ft3", "--k", "4"], 4**3 // 4, 5 * 4**2 // 4, 4**3 // 2),
    (["--topo", "mpft", "--planes", "8", "--k", "64"], 8 * 64**2 // 2, 8 * 3 * 64 // 2, 8 * 64**2 // 2),
])
def test_topo_counts(capsys, args, hosts, switches, links):
    data = _topo_json(capsys, *args)
    assert (data["hosts"], data["switches"], data["fabric_links"]) == (hosts, switches, links)
    assert data["topo"] == args[1]


def test_default_topology(capsys):
    data = _topo_json(capsys)
    assert data["topo"] == "mpft"
    assert (data["hosts"], data["switches"], data["nvlink_domains"], data["planes"]) == (32, 16, 16, 2)
    assert data["params"]["planes"] == 2


def test_storage_flag(capsys):
    data = _topo_json(capsys, "--storage", "--storage-servers", "3")
    assert data["planes"] == 3 and data["hosts"] == 32 + 16 + 3
    assert data["params"]["storage"] is True


def test_plain_text_output(capsys):
    assert main(["topo", "--topo", "ft3", "--k", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ft3 ")
    assert any(line.split() == ["switches", "20"] for line in out.splitlines())


@pytest.mark.parametrize("args, field", [
    (["--planes", "0"], "planes"),
    (["--topo", "ft2", "--k", "63"], "k"),
    (["--nodes", "15"], "leaves"),
    (["--link-mbps", "0"], "link_mbps"),
    (["--topo", "ft3", "--planes", "2"], "planes"),
])
def test_bad_value_is_one_line_exit_2(capsys, args, field):
    assert main(["topo", *args, "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith("mpft: error: ") and f"{field}: " in err


def test_save_then_fabric_gives_the_same_counts(capsys, tmp_path):
    path = tmp_path / "fabric.json"
    built = _topo_json(capsys, "--topo", "ft3", "--k", "4", "--save", str(path))
    assert path.exists()
    loaded = _topo_json(capsys, "--fabric", str(path))
    assert loaded == built


def test_save_then_model_for_mpft_with_storage(capsys, tmp_path):
    """--model, --fabric's old name, still loads one."""
    path = tmp_path / "model.json"
    built = _topo_json(capsys, "--planes", "3", "--nodes", "8", "--leaves", "2", "--storage",
                       "--save", str(path))
    loaded = _topo_json(capsys, "--model", str(path))
    assert loaded == built
    assert (loaded["hosts"], loaded["planes"]) == (3 * 8 + 8 + 4, 4)


def test_missing_fabric_file_is_one_line_exit_2(capsys, tmp_path):
    path = tmp_path / "absent.json"
    assert main(["topo", "--fabric", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and str(path) in err


def test_invalid_fabric_file_is_one_line_exit_2(capsys, tmp_path):
    path = tmp_path / "fabric.json"
    path.write_text("{not json")
    assert main(["topo", "--fabric", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"{path}:1: " in err


def test_unwritable_save_path_is_one_line_exit_2(capsys, tmp_path):
    assert main(["topo", "--save", str(tmp_path / "missing" / "model.json")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1


def test_every_command_prints_its_help(capsys):
    """`mpft CMD --help` works for every command (a % in an option's help text once broke `mpft traffic --help`)."""
    commands = build_parser()._subparsers._group_actions[0].choices
    assert {"traffic", "replay", "run", "topo"} <= set(commands)
    for name in commands:
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        assert done.value.code == 0, name
        assert "usage: mpft " + name in capsys.readouterr().out


@pytest.mark.parametrize("args, says", [
    (["traffic", "all-to-all", "--servers", "gpu2,-oProxyCommand=x"], "--servers: "),
    (["traffic", "all-to-all", "--servers", "localhost,gpu2", "--ssh-config", "/nonexistent/ssh.conf"],
     "/nonexistent/ssh.conf: --ssh-config: no such ssh configuration file"),
    (["run", "routing", "--quick", "--servers", "gpu2,gpu2"], "--servers: gpu2 is listed twice"),
    (["up", "--servers", "gpu2,gpu3"], "servers: list localhost among the servers"),
    (["replay", "/dev/null", "--format", "pcap", "--servers", "localhost,gpu2"], "--servers: a pcap replays on one"),
])
def test_servers_on_the_command_line_are_checked_before_anything_starts(capsys, args, says):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_a_command_our_code_built_that_a_tool_refuses_is_our_fault_exit_1(capsys, monkeypatch):
    """Not the user's: one line and exit 1 (a bad input exits 2), and with -v the command, the tool's words and
    the traceback."""
    from emulator.cli import fabric
    from emulator.net.commands import run_tool

    def refused(args, *_):  # as a malformed batch of ours would be
        run_tool(["tc", "qdisc", "frobnicate"])
    monkeypatch.setattr(fabric, "fabric_from_args", refused)
    assert main(["topo"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "internal error" in err and "tc failed (exit" in err
    assert main(["-v", "topo"]) == 1
    err = capsys.readouterr().err
    assert "['tc', 'qdisc', 'frobnicate']" in err and "frobnicate" in err.split("it said:")[1]
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("mpft: internal error")

"""Integration tier: every built-in study runs in --quick through `mpft run` on real fabrics, and its metrics
make sense: no message lost, no completion below the model's lower bound, the report and plots written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from emulator import features, scenario
from tests.integration.helpers import REPO, leaks, snapshot

pytestmark = pytest.mark.root
MPFT = [sys.executable, "-m", "emulator.cli"]
NOISE = 1.15  # run-to-run spread of one completion time on this shared 2-core machine (README, "Studies")


def _run_study(name: str, out) -> dict:
    run = subprocess.run([*MPFT, "run", name, "--quick", "--out", str(out)], capture_output=True, text=True,
                         cwd=REPO, timeout=1200)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "report:" in run.stdout
    for name in ("report.html", "metrics.json", "scenario.json", "completion.png", "messages_cdf.png",
                 "links.png", "queues.png", "cpu.png"):
        assert (out / name).stat().st_size > 0, name
    return json.loads((out / "metrics.json").read_text())


def _check_sanity(m: dict) -> None:
    for name, v in m["variants"].items():
        assert v["lost_messages"] == 0, name
        for run in v["runs"]:
            assert run["ratio_to_bound"] >= 0.95, (name, run)  # never faster than the model allows
            assert set(run["fidelity"]) >= {"cpu_bound", "rate_ratio", "cpu_idle"}
    assert {"cpu_bound", "rate_ratio", "cpu_idle", "verdict"} <= set(m["fidelity"])


def test_routing_study_spray_and_adaptive_are_not_worse_than_ecmp(tmp_path):
    before = snapshot()
    m = _run_study("routing", tmp_path)
    _check_sanity(m)
    assert len(m["seeds"]) >= 3
    ecmp = m["variants"]["ecmp"]["completion_s"]
    for name in ("spray", "adaptive"):
        assert m["variants"][name]["completion_s"] <= NOISE * ecmp, (name, m["comparisons"])
    assert leaks(before, snapshot()) == {}


def _ordering(m: dict) -> None:
    """The checker finds no flag before its data under psn, fence and release, and catches the unsafe mode."""
    v = m["variants"]
    assert all(v[name]["ordering"]["violations"] == 0 for name in ("psn", "fence", "release"))
    assert v["unsafe"]["ordering"]["violations"] > 0
    assert v["fence"]["ordering"]["fence_wait_us_p99"] > v["psn"]["ordering"]["fence_wait_us_p99"]


def _failover(m: dict) -> None:
    for v in m["variants"].values():
        assert set(v["recovery_s"]) == {"0"} and v["plane_mbps"]["1"]["during"] > 0  # plane 1 kept going


def _multiport(m: dict) -> None:
    """One queue pair kept on one of two half-rate plane ports takes about twice as long as one sprayed."""
    assert m["comparisons"]["spray/fixed"]["median"] < 0.7


def _cc(m: dict) -> None:
    assert ("ecn" in m["skipped"]) != features.detect().ecn_marking  # run where RED exists, else said why


def _voq(m: dict) -> None:
    for v in m["variants"].values():
        assert {"incast", "ring-allreduce/allgather"} <= set(v["by_tag"])


CHECKS = {"ordering": _ordering, "failover": _failover, "multiport": _multiport, "cc": _cc, "voq": _voq}


@pytest.mark.parametrize("name", [n for n in scenario.builtin_names() if n != "routing"])
def test_other_studies_run_quick_and_make_sense(tmp_path, name):
    m = _run_study(name, tmp_path)
    _check_sanity(m)
    CHECKS.get(name, lambda _: None)(m)

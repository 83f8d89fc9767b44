"""The agents' hot path compiled by mypyc (traffic.hotpath), held to its source: the same packets at the same
nanoseconds on made-up clocks, the transport's and the agent's unit tests pass against it, and the runner uses it
only while it was built from the sources as they are."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from traffic import BUILD_ENV, hotpath

ROOT = Path(__file__).resolve().parents[2]
HELD_TO_THE_SOURCE = ["tests/unit/test_transport.py", "tests/unit/test_agent_pacing.py",
                      "tests/unit/test_eventloop.py", "tests/unit/test_cc.py"]


@pytest.fixture(scope="module")
def build() -> Path:
    """The current build (make setup made it), or a fresh one where the sources changed since."""
    return hotpath.current() or hotpath.build()


def _python(args: list[str], build: Path | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != BUILD_ENV}
    if build is not None:
        env[BUILD_ENV] = str(build)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_build_sends_what_the_source_sends(build, tmp_path):
    outputs = {}
    for name, where in (("source", None), ("build", build)):
        (tmp_path / name).mkdir()
        proc = _python(["-m", "tests.unit.hotpath_trace", str(tmp_path / name)], where)
        assert proc.returncode == 0, proc.stderr
        outputs[name] = json.loads(proc.stdout)
    assert outputs["source"].pop("code") == "python"
    assert outputs["build"].pop("code") == "compiled"
    assert len(outputs["source"]["agent"][1]) > 10 and outputs["source"]["transport"][1]["data"] > 100
    assert outputs["build"] == outputs["source"]


def test_the_hot_paths_unit_tests_pass_against_the_build(build):
    proc = _python(["-m", "pytest", "-q", "-p", "no:cacheprovider", *HELD_TO_THE_SOURCE], build)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_a_build_of_other_sources_is_not_used(tmp_path, monkeypatch):
    for name in hotpath.MODULES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    monkeypatch.setattr(hotpath, "ROOT", tmp_path)
    monkeypatch.setattr(hotpath, "BUILD", tmp_path / "build")
    assert hotpath.current() is None and hotpath.environment("auto") == {}
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "SOURCES").write_text(hotpath.fingerprint())
    assert hotpath.current() == tmp_path / "build"
    assert hotpath.environment("auto") == hotpath.environment("compiled") == {BUILD_ENV: str(tmp_path / "build")}
    assert hotpath.environment("python") == {}
    with (tmp_path / hotpath.MODULES[0]).open("a") as f:
        f.write("\n# edited\n")
    assert hotpath.current() is None and hotpath.environment("auto") == {}
    with pytest.raises(RuntimeError, match="make setup"):
        hotpath.environment("compiled")

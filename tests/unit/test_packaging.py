"""The built wheel carries what a user needs beyond the code (the built-in studies, the eBPF program's source,
the README's worked example, the license) and builds without warnings; `mpft --version` names the release."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# pip on a package index of the machine's own configuration that lacks a project's folder: not our build's doing
MACHINES_INDEX = re.compile(r"WARNING: Location '\S+' is ignored: it is neither a file nor a directory")


def test_the_wheel_ships_the_studies_the_example_the_program_and_the_license(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp_path), str(REPO)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    warnings = [line for line in build.stdout.splitlines() + build.stderr.splitlines()
                if re.search(r"warning", line, re.I) and "byte-compiling is disabled" not in line
                and not MACHINES_INDEX.search(line)]
    assert warnings == []
    [wheel] = tmp_path.glob("mpft_emu-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    studies = {f"emulator/study/builtin/{p.name}" for p in (REPO / "emulator/study/builtin").glob("*.toml")}
    assert studies and studies <= names
    assert {"controllers/examples/least_loaded.py", "controllers/examples/least_loaded.toml",
            "emulator/net/ecn_marker.bpf.c"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "benchmarks/", "build/")) or n.endswith(".so") for n in names)


def test_mpft_version_names_the_release():
    out = subprocess.run([sys.executable, "-m", "emulator.cli", "--version"], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert out.strip() == f"mpft {version}"

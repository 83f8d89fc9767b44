"""The agents' hot path compiled by mypyc: which modules, where the build lives, whether it is current, and
which code an agent process runs.

mypyc compiles the same annotated source to C extension modules: the agents' own work per packet is about a third
of the interpreter's (27 to 9 us stepping an agent on a made-up clock), though in a run the machine's cost of
waking a process is most of an event's CPU (benchmarks/agents.py measures both codes and that floor). An extension
module would shadow its source, so the build lives outside the import path (build/, not committed) and an agent
process loads it only when the runner names it in the environment (traffic/__init__.py, BUILD_ENV); the runner does
so only while the build matches the sources as they are, and falls back to the source otherwise, saying which code
ran. The source stays the reference the unit tests hold the build to.

    python -m traffic.hotpath build     # make setup runs it: needs gcc and the Python headers
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from types import ModuleType

from traffic import BUILD_ENV

MODULES = ("traffic/transport.py", "traffic/entropy.py", "traffic/granter.py", "traffic/cc.py", "traffic/eventloop.py",
           "traffic/plan.py", "traffic/rdma.py")
ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / f"hotpath-{sys.implementation.cache_tag}"
CODES = ("auto", "compiled", "python")
__all__ = ["BUILD_ENV", "build", "current", "environment", "loaded"]


def fingerprint() -> str:
    """What a build is of: the modules' sources, this Python and this mypyc."""
    h = hashlib.sha256(f"{sys.version}\n{_mypy_version()}\n".encode())
    for name in MODULES:
        h.update(name.encode() + b"\0" + (ROOT / name).read_bytes())
    return h.hexdigest()


def _mypy_version() -> str:
    try:
        return metadata.version("mypy")
    except metadata.PackageNotFoundError:
        return "none"


def current() -> Path | None:
    """The build's directory if it was built from the sources as they are now."""
    stamp = BUILD / "SOURCES"
    return BUILD if stamp.is_file() and stamp.read_text() == fingerprint() else None


def environment(code: str) -> dict[str, str]:
    """What an agent process's environment needs for `code` (auto: the build if current, else the source)."""
    build_dir = current() if code in ("auto", "compiled") else None
    if code == "compiled" and build_dir is None:
        raise RuntimeError("no current mypyc build of the agents' hot path: run make setup")
    return {BUILD_ENV: str(build_dir)} if build_dir else {}


def loaded(module: ModuleType) -> str:
    """Which code `module` (one of MODULES, imported) is: compiled or python."""
    return "compiled" if Path(module.__file__ or "").suffix == ".so" else "python"


def build() -> Path:
    """Compile MODULES into BUILD (replacing an older build only once the new one is complete)."""
    from mypyc.build import mypycify
    from setuptools import Distribution

    BUILD.parent.mkdir(parents=True, exist_ok=True)
    stamp = fingerprint()
    work = Path(tempfile.mkdtemp(prefix=BUILD.name + ".", dir=BUILD.parent))
    try:
        extensions = mypycify(["--follow-imports=silent", "--ignore-missing-imports",
                               *(str(ROOT / m) for m in MODULES)], opt_level="3", target_dir=str(work / "c"))
        dist = Distribution({"ext_modules": extensions, "script_name": "traffic.hotpath",
                             "script_args": ["-q", "build_ext", "--build-lib", str(work / "lib"),
                                             "--build-temp", str(work / "c")]})
        dist.parse_command_line()
        dist.run_commands()
        (work / "lib" / "SOURCES").write_text(stamp)
        old = BUILD.with_name(BUILD.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if BUILD.exists():
            BUILD.rename(old)
        (work / "lib").rename(BUILD)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BUILD


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["build"]:
        print("usage: python -m traffic.hotpath build", file=sys.stderr)
        return 2
    if current():
        print(f"hotpath: {BUILD} is current")
        return 0
    print(f"hotpath: compiling {', '.join(MODULES)} with mypyc (about 20 s)")
    build()
    return 0


if __name__ == "__main__":
    sys.exit(main())

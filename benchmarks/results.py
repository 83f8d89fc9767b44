"""The one place measured figures live: each benchmark script's printed output, with when, where and how it was
measured, as one section of benchmarks/RESULTS.md that the script's next successful run replaces.

    if __name__ == "__main__":
        with recorded("bringup"):
            main()
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
HEADER = """# Benchmark results

Written by `sudo make bench` (`benchmarks/results.py`): each script replaces its own section when it completes.
The machine is shared and the figures vary from run to run; each section says when, where and how it was measured.
"""


class _Tee(io.TextIOBase):
    """Writes through to the terminal and keeps a copy."""

    def __init__(self, out) -> None:
        self.out, self.copy = out, io.StringIO()

    def write(self, s: str) -> int:
        self.copy.write(s)
        return self.out.write(s)

    def flush(self) -> None:
        self.out.flush()


def median_range(values: list[float], fmt: str = ".1f") -> str:
    """A figure over seeds, as the benchmarks print it: the median and (the range)."""
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _commit() -> str:
    git = ["git", "-C", str(ROOT), "-c", f"safe.directory={ROOT}"]
    commit = _run([*git, "rev-parse", "--short=12", "HEAD"]) or "unknown"
    changed = _run([*git, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/RESULTS.md"])
    return commit + (" with uncommitted changes" if changed else "")


def _command() -> str:
    """The command line, with the interpreter and the script relative to the repository where they are in it."""

    def short(path: str) -> str:
        with contextlib.suppress(ValueError):
            return str(Path(os.path.abspath(path)).relative_to(ROOT))
        return path

    return shlex.join([short(sys.executable), short(sys.argv[0]), *sys.argv[1:]])


def section(name: str, output: str, started: datetime.datetime, seconds: float) -> str:
    """One script's section: the measurement's context, then its printed figures verbatim."""
    ovs = _run(["ovs-vswitchd", "--version"]).splitlines()
    return "\n".join([
        f"<!-- bench:{name} -->",
        f"## {name}",
        "",
        f"- date: {started:%Y-%m-%d %H:%M %Z}, took {seconds / 60:.1f} min",
        f"- commit: {_commit()}",
        f"- machine: {os.cpu_count()} cores, kernel {platform.release()}, {ovs[0] if ovs else 'OVS not found'}",
        f"- command: `{_command()}`",
        "",
        "```",
        output.rstrip("\n"),
        "```",
        f"<!-- /bench:{name} -->",
    ]) + "\n"


def replace(text: str, name: str, new: str) -> str:
    """`text` with the section `name` replaced by `new`, or `new` appended if there was none."""
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->\n.*?<!-- /bench:{re.escape(name)} -->\n", re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: new, text, count=1)
    return (text or HEADER).rstrip("\n") + "\n\n" + new


@contextlib.contextmanager
def recorded(name: str, path: Path = RESULTS) -> Iterator[None]:
    """Print as usual; on success, also write what was printed as section `name` of `path`."""
    tee = _Tee(sys.stdout)
    started, t0 = datetime.datetime.now().astimezone(), time.monotonic()
    with contextlib.redirect_stdout(tee):
        yield
    old = path.read_text() if path.exists() else ""
    path.write_text(replace(old, name, section(name, tee.copy.getvalue(), started, time.monotonic() - t0)))
    print(f"figures written to {path}", file=sys.stderr)

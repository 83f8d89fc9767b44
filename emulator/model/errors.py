"""What can go wrong, by whose it is: bad input (UserError) and a machine that lacks what a run needs
(EnvironmentProblem) are one line and exit code 2; our own fault (InternalError, ToolFailed) is one line and exit
code 1, and with -v the command, what it said and a traceback. The CLI (emulator.cli.main) says which."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class UserError(Exception):
    """Bad input (parameters, files, arguments), reported before anything is started.

    `file`, `line` and `field` say where the problem is, so the message can point at it.
    """

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.field = field

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line is not None else f"{self.file}: "
        field = f"{self.field}: " if self.field else ""
        return f"{where}{field}{self.message}"


class EnvironmentProblem(UserError):
    """The machine lacks something the run needs (root, Open vSwitch, a tool, a free run lock, a kernel feature):
    also one line and exit code 2, for the user to fix on the machine."""


class InternalError(Exception):
    """Something mpft-emu built was refused although the machine has what it needs: our bug, not the user's. One
    line with a plea to report it; exit code 1."""


class ToolFailed(InternalError):
    """A system tool refused a command our code built (a tc or ip batch, an ovsdb call): the one-line summary
    names the tool and the first line it said; `argv` and `stderr` are whole, for -v."""

    def __init__(self, argv: list[str], returncode: int, stderr: str) -> None:
        said = next((line.strip() for line in stderr.splitlines() if line.strip()), "nothing")
        super().__init__(f"{argv[0]} failed (exit {returncode}): {said[:300]}")
        self.argv, self.returncode, self.stderr = argv, returncode, stderr


class Terminated(Exception):
    """SIGTERM arrived: raised so that `with Emulation(...)` unwinds and tears down."""


def read_file(path: Path, what: str, binary: bool = False) -> Any:
    """A user's file (UTF-8 text, or bytes); a missing, unreadable or undecodable one is a one-line UserError."""
    try:
        return Path(path).read_bytes() if binary else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {what}: {getattr(exc, 'strerror', None) or exc}", file=str(path)) from None


def load_json(path: Path, what: str) -> Any:
    """A user's JSON file, with unreadable files and syntax errors as one-line UserErrors naming file and line."""
    text = read_file(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"invalid JSON: {exc.msg}", file=str(path), line=exc.lineno) from None

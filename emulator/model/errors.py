"""The one exception family for bad user input: the CLI prints it as one line and exits with code 2."""

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
    """The machine lacks something the run needs (root, OVS, a free lock): also a one-line error, exit 2."""


class InternalError(Exception):
    """A command mpft-emu built was refused although the machine has what it needs: our bug, not the user's. One
    line too, with a plea to report it; exit code 70 (EX_SOFTWARE), not 2."""


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

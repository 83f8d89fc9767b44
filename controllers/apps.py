"""The apps mpft knows by name, and how a name or a path becomes what os-ken loads."""

from __future__ import annotations

import re
from pathlib import Path

from emulator.model.errors import UserError

BUILTIN_APPS = ("ecmp", "spray", "static", "adaptive")


def app_module(app: str) -> str:
    """Module name or file path os-ken should load for `app`."""
    if app in BUILTIN_APPS:
        return f"controllers.{app}"
    path = Path(app)
    if path.suffix == ".py":
        if not path.is_file():
            raise UserError("no such controller app file", file=app, field="app")
        return str(path.resolve())
    raise UserError(f"unknown app {app!r} (built in: {', '.join(BUILTIN_APPS)}; or a path to a .py file)",
                    field="app")


_RYU_IMPORT = re.compile(r"^\s*(?:from|import)\s+ryu\b", re.M)


def is_ryu_app(module: str) -> bool:
    """An app file written against Ryu (it imports `ryu`): it runs on os-ken through controllers.ryu_compat, under
    Ryu's own hub, eventlet (os-ken's native hub cannot time out a wait, and Ryu's stplib waits on timeouts)."""
    path = Path(module)
    return path.suffix == ".py" and path.is_file() and bool(_RYU_IMPORT.search(path.read_text(errors="replace")))

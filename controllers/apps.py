"""The apps mpft knows by name, and how a name or a path becomes what os-ken loads."""

from __future__ import annotations

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

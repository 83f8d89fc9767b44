"""Ryu apps unchanged on os-ken: `import ryu.x` gives the module `os_ken.x` itself (the same object, so an app's
handlers register with the one app registry os-ken runs), and `RyuApp` is `OSKenApp`.

os-ken is Ryu's maintained fork (renamed by OpenStack): the modules an app uses (app_manager, controller.handler,
ofp_event, ofproto, lib.packet, lib.stplib) keep their names under the new package. It dropped Ryu's example apps
(`ryu.app.simple_switch_13`, which `simple_switch_stp_13` builds on): `ryu.app.X` that os-ken lacks is looked for
as X.py beside the app being run.

Installed only in the controller process mpft starts (controllers.harness), and not at all where a real Ryu is
installed (it is the one imported then). The finder goes first: behind the import system's own, `ryu.base` would
be found in os_ken's directory through the alias's `__path__` and run a second time under the new name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PREFIX, TARGET = "ryu", "os_ken"


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `ryu[.x]` as the already imported (or now imported) `os_ken[.x]`."""

    def __init__(self) -> None:
        self.app_dirs: list[Path] = []  # where `ryu.app.X` that os-ken lacks may be found as X.py

    def find_spec(self, fullname, path=None, target=None):  # noqa: ARG002 - the finder protocol
        if fullname.startswith(f"{TARGET}.app.") and importlib.machinery.PathFinder.find_spec(fullname, path) is None:
            return self._beside_the_app(fullname)  # `from ryu.app import X` asks for os_ken.app.X by that name
        if fullname != PREFIX and not fullname.startswith(PREFIX + "."):
            return None
        real = TARGET + fullname[len(PREFIX):]
        try:
            module = importlib.import_module(real)
        except ImportError:
            return self._beside_the_app(fullname)
        spec = importlib.machinery.ModuleSpec(fullname, self, is_package=hasattr(module, "__path__"))
        spec.loader_state = (module, module.__spec__)
        return spec

    def _beside_the_app(self, fullname: str):
        head, _, name = fullname.rpartition(".")
        if head not in (f"{PREFIX}.app", f"{TARGET}.app"):
            return None
        for directory in self.app_dirs:
            if (directory / f"{name}.py").is_file():
                return importlib.util.spec_from_file_location(fullname, directory / f"{name}.py")
        return None

    def create_module(self, spec) -> ModuleType:
        return spec.loader_state[0]

    def exec_module(self, module: ModuleType) -> None:
        # the import system has just set the alias's spec on the module: it gets os-ken's own back
        module.__spec__ = module.__spec__.loader_state[1]


_FINDER = _Alias()


def install(app_dirs: list[Path] = ()) -> bool:
    """Make `ryu` importable as os-ken for this process, with RyuApp as OSKenApp, and Ryu's example apps found in
    `app_dirs`; False (nothing done) where a real Ryu is installed."""
    _FINDER.app_dirs = list(app_dirs)
    if _FINDER in sys.meta_path:
        return True
    if importlib.util.find_spec(PREFIX) is not None:
        return False
    from os_ken.base import app_manager

    if not hasattr(app_manager, "RyuApp"):
        app_manager.RyuApp = app_manager.OSKenApp
    sys.meta_path.insert(0, _FINDER)
    return True


def uninstall() -> None:
    """The hook and every `ryu` alias gone (os-ken's modules stay as they were)."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n in sys.modules if n == PREFIX or n.startswith(PREFIX + ".")]:
        if getattr(sys.modules[name], "__name__", "").startswith(TARGET):
            del sys.modules[name]

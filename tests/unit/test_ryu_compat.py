"""Ryu apps on os-ken (controllers.ryu_compat): `ryu.x` is the module `os_ken.x` itself, not a second copy with a
registry of its own; RyuApp is OSKenApp; Ryu's example apps that os-ken dropped are found beside the app; a real
Ryu is left alone; uninstall leaves no alias behind."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

from controllers import ryu_compat
from controllers.apps import is_ryu_app


def _run(code: str, tmp_path=None) -> str:
    """In a fresh interpreter, so the hook and its aliases never leak into this one."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True,
                          cwd=tmp_path).stdout.strip()


def test_ryu_modules_are_os_kens_own_objects():
    out = _run("""
        from controllers import ryu_compat
        assert ryu_compat.install()
        import os_ken.base.app_manager, os_ken.controller.handler, os_ken.lib.stplib
        import ryu.base.app_manager, ryu.controller.handler, ryu.lib.stplib
        from ryu.base import app_manager
        from ryu.ofproto import ofproto_v1_3
        import os_ken.ofproto.ofproto_v1_3
        print(ryu.base.app_manager is os_ken.base.app_manager, ryu.lib.stplib is os_ken.lib.stplib,
              ofproto_v1_3 is os_ken.ofproto.ofproto_v1_3, app_manager.RyuApp is app_manager.OSKenApp,
              app_manager.__spec__.name, len(app_manager.SERVICE_BRICKS) == 0)
    """)
    assert out == "True True True True os_ken.base.app_manager True"


def test_an_example_os_ken_dropped_is_found_beside_the_app(tmp_path):
    (tmp_path / "simple_switch_13.py").write_text("from ryu.base import app_manager\nNAME = 'beside'\n")
    out = _run(f"""
        from pathlib import Path
        from controllers import ryu_compat
        ryu_compat.install([Path({str(tmp_path)!r})])
        from ryu.app import simple_switch_13
        import ryu.app.simple_switch_13 as again
        print(simple_switch_13.NAME)
    """)
    assert out == "beside"


def test_a_real_ryu_is_not_shadowed(tmp_path):
    (tmp_path / "ryu").mkdir()
    (tmp_path / "ryu" / "__init__.py").write_text("REAL = True\n")
    out = _run("""
        import sys; sys.path.insert(0, '.')
        from controllers import ryu_compat
        installed = ryu_compat.install()
        import ryu
        print(installed, getattr(ryu, 'REAL', False))
    """, tmp_path=tmp_path)
    assert out == "False True"


def test_uninstall_takes_every_alias_away():
    assert ryu_compat.install()
    importlib.import_module("ryu.controller.handler")
    ryu_compat.uninstall()
    assert not [name for name in sys.modules if name == "ryu" or name.startswith("ryu.")]
    assert ryu_compat._FINDER not in sys.meta_path


def test_an_app_importing_ryu_is_known_as_one(tmp_path):
    (tmp_path / "r.py").write_text("import os\nfrom ryu.base import app_manager\n")
    (tmp_path / "o.py").write_text("from os_ken.base import app_manager  # not ryu\n")
    assert is_ryu_app(str(tmp_path / "r.py")) and not is_ryu_app(str(tmp_path / "o.py"))
    assert not is_ryu_app("controllers.ecmp")

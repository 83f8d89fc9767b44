"""The house's layers (pyproject.toml's import-linter contract): every module of ours sits in exactly one layer,
and no import of our own modules hides inside a function, where it could dodge the contract or a cycle."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OURS = ("emulator", "controllers", "traffic")
# Imports of our own that must stay inside a function, each with the reason.
DEFERRED = {
    ("traffic/pcapreplay.py", "emulator.model.fabric"):
        "the replay sender starts 0.5 s before its first frame: only the planner needs networkx",
}
# Modules that import by name at run time, each with the reason: never one of ours.
DYNAMIC = {
    "controllers/ryu_compat.py": "imports os-ken's modules under the names Ryu apps ask for (its TARGET is os_ken)",
}


def _modules() -> dict[str, Path]:
    found = {}
    for top in OURS:
        for path in sorted((REPO / top).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _layers() -> list[list[str]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return [[name.strip() for name in line.replace(":", "|").split("|")] for line in contract["layers"]]


def _in(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


def test_every_module_sits_in_exactly_one_layer():
    layers = [name for line in _layers() for name in line]
    outside, twice = [], []
    for module, path in _modules().items():
        homes = [layer for layer in layers if _in(module, layer)]
        if not homes and not (module in OURS and not ast.parse(path.read_text()).body[1:]):
            outside.append(module)  # a top package's __init__ holding nothing but its docstring is no module
        if len(homes) > 1:
            twice.append((module, homes))
    assert outside == [], f"modules the layer contract does not cover: {outside}"
    assert twice == []


def test_no_import_of_ours_inside_a_function():
    found = set()
    for path in _modules().values():
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                    [a.name for a in node.names] if isinstance(node, ast.Import) else []
                found.update((str(path.relative_to(REPO)), name) for name in names if name.split(".")[0] in OURS)
    assert found == set(DEFERRED)


def test_the_contract_has_no_way_around_it():
    text = (REPO / "pyproject.toml").read_text()
    assert "ignore_imports" not in text
    for path in _modules().values():
        source = path.read_text()
        if str(path.relative_to(REPO)) in DYNAMIC:
            continue
        assert "importlib.import_module" not in source and "__import__(" not in source, path
    assert 'PREFIX, TARGET = "ryu", "os_ken"' in (REPO / "controllers" / "ryu_compat.py").read_text()

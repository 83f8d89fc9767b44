"""A JSON Schema of scenario files, for editors that check TOML against one (Even Better TOML, Taplo: point them
at `scenario.schema.json`, or put `#:schema <path>` on a scenario's first line). It is generated from the tables
scenario.py checks against, so the two cannot drift, and the file beside this module is its output (a test
keeps them equal: `python -m emulator.study.schema > emulator/study/scenario.schema.json` after a change). The
checker stays the authority: it also knows what a schema cannot say (that a link's switches exist, a pattern's
parameters, a trace file's contents)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from emulator.model.capture import MIN_SNAPLEN
from emulator.model.fabric import DIRECTIONS
from emulator.model.faults import FAULTS
from emulator.model.topologies import QUEUEING
from emulator.study import scenario as sc
from traffic import patterns, traces
from traffic.options import TransportOptions

FILE = Path(__file__).with_name("scenario.schema.json")
SCALAR = {"type": ["string", "number", "boolean"]}
TOPOLOGY = {"type": "object", "description": "the `mpft topo` options (topo, planes, nodes, ...)",
            "additionalProperties": SCALAR}
SEEDS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": sc.MAX_SEED}, "minItems": 1,
         "uniqueItems": True}
TIMEOUT = {"type": "number", "exclusiveMinimum": 0, "maximum": sc.MAX_TIMEOUT_S}


def _table(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def _option(f) -> dict[str, Any]:
    """One transport option as the checker takes it (traffic.options.TransportOptions' table)."""
    meta, default = f.metadata, f.default
    out: dict[str, Any] = {"description": meta["help"]}
    if isinstance(default, bool):
        out["type"] = "boolean"
    elif isinstance(default, int):
        out["type"] = "integer"
    elif isinstance(default, float):
        out["type"] = "number"
    else:
        out["type"] = "string"
    if meta["choices"] and f.name != "cc":  # cc is a kernel algorithm's name under transport = "tcp"
        out["enum"] = list(meta["choices"])
    if meta["low"] is not None:
        out["minimum"] = meta["low"]
    if meta["high"] is not None:
        out["maximum"] = meta["high"]
    return out


def schema() -> dict[str, Any]:
    options = {f.name: _option(f) for f in fields(TransportOptions) if f.metadata["user"]}
    traffic = _table({"pattern": {"enum": sorted(patterns.PATTERNS)}, "params": {"type": "object"},
                      "start_s": {"type": "number", "minimum": 0, "maximum": sc.MAX_START_S},
                      "trace": {"type": "string", "minLength": 1}, "format": {"enum": list(traces.FORMATS)},
                      "comm_groups": {"type": "string", "minLength": 1}})
    traffic["oneOf"] = [{"required": ["pattern"]}, {"required": ["trace"]}]
    variant = _table({"name": {"type": "string", "pattern": "^[A-Za-z0-9_-]+$"},
                      "app": {"type": "string", "minLength": 1, "description": "a built-in app or a .py path"},
                      "queueing": {"enum": list(QUEUEING)},
                      "traffic": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
                      "optional": {"type": "boolean"}, "topology": TOPOLOGY, **options}, ("name", "app"))
    fault = _table({"at_s": {"type": "number", "minimum": 0}, "action": {"enum": sorted(FAULTS)},
                    "link": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2},
                    "switch": {"type": "string"}, "plane": {"type": "integer", "minimum": 0, "maximum": sc.MAX_PLANE},
                    "rate_fraction": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                    "direction": {"enum": list(DIRECTIONS)}}, ("at_s", "action"))
    quick = _table({"seeds": SEEDS, "timeout_s": TIMEOUT, "topology": TOPOLOGY,
                    "traffic_scale": {"type": "number", "exclusiveMinimum": 0},
                    "variants": {"type": "array", "items": {"type": "string"}, "minItems": 1}})
    top = _table({"name": {"type": "string", "minLength": 1}, "question": {"type": "string"},
                  "focus": {"type": "string", "minLength": 1}, "seeds": SEEDS, "timeout_s": TIMEOUT,
                  "topology": TOPOLOGY, "traffic": {"type": "array", "items": traffic, "minItems": 1},
                  "variants": {"type": "array", "items": variant, "minItems": 1},
                  "faults": {"type": "array", "items": fault},
                  "capture": {"oneOf": [{"type": "boolean"},
                                        {"type": "array", "items": {"type": "string", "minLength": 1},
                                         "minItems": 1}]},
                  "capture_bytes": {"type": "integer", "minimum": MIN_SNAPLEN, "maximum": 65535},
                  "controller": {"type": "string", "pattern": "^tcp:[A-Za-z0-9._-]+:[0-9]+$"},
                  "servers": {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1,
                              "uniqueItems": True},
                  "ssh_config": {"type": "string", "minLength": 1},
                  "quick": quick}, ("traffic", "variants"))
    assert set(top["properties"]) == set(sc.TOP_KEYS) and set(variant["properties"]) == set(sc.VARIANT_KEYS)
    assert set(traffic["properties"]) == set(sc.TRAFFIC_KEYS) and set(fault["properties"]) == set(sc.FAULT_KEYS)
    assert set(quick["properties"]) == set(sc.QUICK_KEYS)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "mpft-emu/scenario",
            "title": "mpft-emu scenario (emulator/study/README.md)", **top}


def text() -> str:
    return json.dumps(schema(), indent=1) + "\n"


if __name__ == "__main__":
    print(text(), end="")

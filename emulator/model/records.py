"""Typed records from their JSON form: the one reader for every results file we write with `asdict`."""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """A dataclass from a dict: nested records rebuilt by their type hints; a key the class lacks is ignored
    (a file from a newer version) and a missing one takes the field's default (a file from an older one)."""
    hints = _hints(cls)
    return cls(**{f.name: _build(hints[f.name], data[f.name]) for f in fields(cls) if f.name in data})


_hints = functools.cache(typing.get_type_hints)  # a report reads one record per run of every variant


def _build(kind: Any, value: Any) -> Any:
    if value is None:
        return None
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        real = [a for a in args if a is not type(None)]
        return _build(real[0], value) if len(real) == 1 else value
    if is_dataclass(kind):
        return from_dict(kind, value)
    if origin is list:
        return [_build(args[0], v) for v in value]
    if origin is dict:
        return {k: _build(args[1], v) for k, v in value.items()}
    return value


def to_json(value: Any) -> Any:
    """A record (or what holds records) as plain JSON values, from_dict's inverse: dataclasses as dicts, tuples as
    lists, paths as strings."""
    if is_dataclass(value) and not isinstance(value, type):
        return to_json(asdict(value))
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value

"""Messages and the JSON Lines trace format: what every pattern generator, importer and run records.

One message per line, a JSON object:

    {"id": 7, "start_s": 0.0, "src": "n0g1", "dst": "n2g1", "bytes": 65536,
     "tclass": 0, "qp": 1, "deps": [3, 5], "op": "write", "tag": "dispatch"}

- `id`: a unique non-negative integer; `deps` may only name ids on earlier lines.
- `start_s`: seconds from the trace start before which the message is not posted.
- `src`, `dst`: host names of the fabric (`n0g1`, `h3`, `n1sc`, ...); they must differ.
- `bytes`: payload bytes, > 0.  `tclass`: traffic class 0-7 (default 0).  `qp`: queue pair number 1..2^24-1
  (default 1); messages of one (src, dst, qp) are delivered in order, as on an RDMA reliable connection.
- `deps`: a message is posted when its start time has come *and* every dependency has completed, as seen by its
  sender: each dependency must be sent or received by this message's `src` (completion = fully acknowledged for
  a message it sent, fully delivered for one it received). Ring all-reduce steps and Chakra graphs are chains of
  these.
- `op`: `write` (RDMA WRITE, the default) or `send`.  `tag`: an optional label (the pattern or collective).

Blank lines and lines starting with `#` are ignored.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from emulator.model.errors import UserError, read_file

OPS = ("write", "send")
MAX_QP = (1 << 24) - 1


@dataclass(frozen=True)
class Message:
    id: int
    start_s: float
    src: str
    dst: str
    bytes: int
    tclass: int = 0
    qp: int = 1
    deps: tuple[int, ...] = field(default_factory=tuple)
    op: str = "write"
    tag: str = ""

    def to_json(self) -> str:
        d = asdict(self)
        d["deps"] = list(self.deps)
        if not self.tag:
            del d["tag"]
        return json.dumps(d, separators=(", ", ": "))


_REQUIRED = ("id", "start_s", "src", "dst", "bytes")
_KNOWN = set(_REQUIRED) | {"tclass", "qp", "deps", "op", "tag"}


def _int(obj: dict, key: str, default: int | None, lo: int, hi: int | None, where: dict) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"must be an integer, got {json.dumps(value)}", field=key, **where)
    if value < lo or (hi is not None and value > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise UserError(f"must be {bound}, got {value}", field=key, **where)
    return value


def message_from_dict(obj: object, *, file: str | None = None, line: int | None = None) -> Message:
    """One validated message; errors name the file, line and field."""
    where = {"file": file, "line": line}
    if not isinstance(obj, dict):
        raise UserError("a message must be a JSON object", **where)
    for key in _REQUIRED:
        if key not in obj:
            raise UserError("missing", field=key, **where)
    unknown = sorted(set(obj) - _KNOWN)
    if unknown:
        raise UserError(f"unknown field (known: {', '.join(sorted(_KNOWN))})", field=unknown[0], **where)
    start = obj["start_s"]
    if isinstance(start, bool) or not isinstance(start, (int, float)) or not 0 <= start <= sys.float_info.max:
        raise UserError(f"must be a finite number >= 0, got {json.dumps(start)}", field="start_s", **where)
    for key in ("src", "dst"):
        if not isinstance(obj[key], str) or not obj[key]:
            raise UserError("must be a host name", field=key, **where)
    if obj["src"] == obj["dst"]:
        raise UserError(f"source and destination are both {obj['src']}", field="dst", **where)
    deps = obj.get("deps", [])
    if not isinstance(deps, list):
        raise UserError("must be a list of message ids", field="deps", **where)
    for dep in deps:
        if isinstance(dep, bool) or not isinstance(dep, int) or dep < 0:
            raise UserError(f"must be a list of message ids, got {json.dumps(dep)}", field="deps", **where)
    op = obj.get("op", "write")
    if op not in OPS:
        raise UserError(f"must be one of {', '.join(OPS)}, got {json.dumps(op)}", field="op", **where)
    tag = obj.get("tag", "")
    if not isinstance(tag, str):
        raise UserError("must be a string", field="tag", **where)
    return Message(id=_int(obj, "id", None, 0, None, where), start_s=float(start), src=obj["src"],
                   dst=obj["dst"], bytes=_int(obj, "bytes", None, 1, None, where),
                   tclass=_int(obj, "tclass", 0, 0, 7, where), qp=_int(obj, "qp", 1, 1, MAX_QP, where),
                   deps=tuple(deps), op=op, tag=tag)


def check(messages: Iterable[Message], hosts: Iterable[str] | None = None, *, file: str | None = None,
          lines: list[int] | None = None) -> list[Message]:
    """Whole-schedule rules: unique ids, dependencies on earlier messages that the sender can see, known hosts."""
    messages = list(messages)
    known = set(hosts) if hosts is not None else None
    seen: dict[int, Message] = {}
    for i, msg in enumerate(messages):
        where = {"file": file, "line": lines[i] if lines else None}
        if msg.id in seen:
            raise UserError(f"duplicate message id {msg.id}", field="id", **where)
        if known is not None:
            for key in ("src", "dst"):
                name = getattr(msg, key)
                if name not in known:
                    raise UserError(f"unknown host {name!r} (not in this fabric)", field=key, **where)
        for dep in msg.deps:
            earlier = seen.get(dep)
            if earlier is None:
                raise UserError(f"dependency {dep} is not an earlier message", field="deps", **where)
            if msg.src not in (earlier.src, earlier.dst):
                raise UserError(f"dependency {dep} ({earlier.src}->{earlier.dst}) is not sent or received by "
                                f"{msg.src}, so {msg.src} cannot see it complete", field="deps", **where)
        seen[msg.id] = msg
    return messages


def read(path: str | Path, hosts: Iterable[str] | None = None) -> list[Message]:
    """A JSON Lines trace, validated (against `hosts` when given)."""
    path = Path(path)
    text = read_file(path, "trace")
    messages, lines = [], []
    for number, raw in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 may sit in a JSON string
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            obj = json.loads(stripped)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, a number over the digit limit, deep nesting
            raise UserError(f"invalid JSON: {getattr(exc, 'msg', exc)}", file=str(path), line=number) from None
        messages.append(message_from_dict(obj, file=str(path), line=number))
        lines.append(number)
    if not messages:
        raise UserError("the trace has no messages", file=str(path))
    return check(messages, hosts, file=str(path), lines=lines)


def write(path: str | Path, messages: Iterable[Message]) -> Path:
    path = Path(path)
    path.write_text("".join(m.to_json() + "\n" for m in messages))
    return path


def scaled(messages: Iterable[Message], factor: float) -> list[Message]:
    """Every message's bytes times `factor`, at least 1 byte: traces written for 100-400 Gbit/s fabrics are far
    too large for 10 Mbit/s links, and a quick study is a smaller one."""
    return [replace(m, bytes=max(1, round(m.bytes * factor))) for m in messages]


def hosts_of(messages: Iterable[Message]) -> list[str]:
    return sorted({m.src for m in messages} | {m.dst for m in messages})

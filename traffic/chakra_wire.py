"""The protobuf wire format of Chakra execution traces (`.et`), decoded by hand: protobuf is not a dependency, and
a trace needs only a few wire types. A file is a stream of messages, each preceded by its length as a varint:
first a `GlobalMetadata`, then `Node`s (schema: mlcommons/chakra `schema/protobuf/et_def.proto`, package
ChakraProtoMsg). traffic.chakra turns the nodes into a message schedule."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

from emulator.model.errors import UserError, read_file

# A schema maps field number -> (name, kind, repeated); kind is a scalar name or a nested schema (a dict).
# Scalars: wire type and how to convert the raw value. int32/int64 are sign-extended 64-bit varints.
_WIRE = {"uint": 0, "int": 0, "sint": 0, "bool": 0, "double": 1, "fixed64": 1, "sfixed64": 1, "float": 5,
         "fixed32": 5, "sfixed32": 5, "string": 2, "bytes": 2}
_STRUCT = {"double": "<d", "fixed64": "<Q", "sfixed64": "<q", "float": "<f", "fixed32": "<I", "sfixed32": "<i"}
_ATTR_KINDS = ("double", "float", "int", "int", "uint", "uint", "sint", "sint", "fixed32", "fixed64", "sfixed32",
               "sfixed64", "bool", "string", "bytes")
# AttributeProto: name, doc_string, then a oneof of each kind (field 3 + 2k) and a list of it (4 + 2k).
ATTRIBUTE = {1: ("name", "string", False), 2: ("doc_string", "string", False)}
for _k, _kind in enumerate(_ATTR_KINDS):
    ATTRIBUTE[3 + 2 * _k] = ("value", _kind, False)
    ATTRIBUTE[4 + 2 * _k] = ("value", {1: ("values", _kind, True)}, False)
GLOBAL_METADATA = {1: ("version", "string", False), 2: ("attr", ATTRIBUTE, True)}
IO_INFO = {1: ("values", "string", False)}  # shapes and types are not needed
NODE = {1: ("id", "uint", False), 2: ("name", "string", False), 3: ("type", "uint", False),
        4: ("ctrl_deps", "uint", True), 5: ("data_deps", "uint", True), 6: ("start_time_micros", "uint", False),
        7: ("duration_micros", "uint", False), 8: ("inputs", IO_INFO, False),
        10: ("attr", ATTRIBUTE, True)}  # 9 and 11 are not needed


class _Malformed(Exception):
    """A decoding problem at a byte offset, turned into a UserError naming the file and record."""

    def __init__(self, reason: str, offset: int, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.offset, self.field = reason, offset, field


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    start = pos
    while pos < end:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise _Malformed("varint longer than 10 bytes", start)
    raise _Malformed("truncated varint", start)


def _wire_fields(buf: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, object]]:
    """(offset, field number, wire type, raw value) of each field; wire type 2 gives a (start, end) span."""
    while pos < end:
        at = pos
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Malformed("field number 0", at)
        if wire == 0:
            value, pos = _varint(buf, pos, end)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > end:
                raise _Malformed(f"truncated {size * 8}-bit field {number}", at)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise _Malformed(f"field {number} claims {length} bytes, only {end - pos} left", at)
            value, pos = (pos, pos + length), pos + length
        else:  # 3 and 4 are the deprecated groups, 6 and 7 do not exist
            raise _Malformed(f"unsupported wire type {wire} in field {number}", at)
        yield at, number, wire, value


def _scalar(kind: str, wire: int, raw: object, buf: bytes) -> object:
    if wire == 2:
        data = buf[raw[0]:raw[1]]
        return data if kind == "bytes" else data.decode("utf-8")
    if wire in (1, 5):
        return struct.unpack(_STRUCT[kind], raw)[0]
    if kind == "int":
        raw &= (1 << 64) - 1
        return raw - (1 << 64) if raw >> 63 else raw
    if kind == "sint":
        return (raw >> 1) ^ -(raw & 1)
    return bool(raw) if kind == "bool" else raw


def _decode(buf: bytes, pos: int, end: int, schema: dict) -> dict:
    """One message as a dict of the fields in `schema` (unknown field numbers skipped, as protobuf does)."""
    out: dict = {}
    for at, number, wire, raw in _wire_fields(buf, pos, end):
        if number not in schema:
            continue
        name, kind, repeated = schema[number]
        try:
            if isinstance(kind, dict):
                if wire != 2:
                    raise ValueError(f"wire type {wire}, expected a length-delimited message")
                value = _decode(buf, raw[0], raw[1], kind)
            elif wire == _WIRE[kind]:
                value = _scalar(kind, wire, raw, buf)
            elif repeated and wire == 2 and _WIRE[kind] != 2:
                out.setdefault(name, []).extend(_packed(buf, raw, kind))
                continue
            else:
                raise ValueError(f"wire type {wire}, expected {_WIRE[kind]} for {kind}")
        except (ValueError, UnicodeDecodeError, struct.error) as exc:
            raise _Malformed(str(exc), at, name) from None
        except _Malformed as exc:
            raise _Malformed(exc.reason, exc.offset, exc.field or name) from None
        if repeated:
            out.setdefault(name, []).append(value)
        else:
            out[name] = value
    return out


def _packed(buf: bytes, span: tuple[int, int], kind: str) -> list:
    """A packed repeated numeric field: varints back to back, or fixed-size values."""
    pos, end = span
    wire = _WIRE[kind]
    values = []
    while pos < end:
        if wire == 0:
            raw, pos = _varint(buf, pos, end)
        else:
            size = 8 if wire == 1 else 4
            if pos + size > end:
                raise ValueError(f"packed {kind} list of {end - span[0]} bytes is not a multiple of {size}")
            raw, pos = buf[pos:pos + size], pos + size
        values.append(_scalar(kind, wire, raw, buf))
    return values


def read_records(path: str | Path) -> tuple[dict, list[tuple[int, dict]]]:
    """GlobalMetadata and the Nodes of one `.et` file, each node with its record number (metadata is 0)."""
    path = Path(path)
    buf = read_file(path, "Chakra trace", binary=True)
    pos, record, nodes, metadata = 0, 0, [], None
    while pos < len(buf):
        start = pos
        try:
            length, pos = _varint(buf, pos, len(buf))
            if pos + length > len(buf):
                raise _Malformed(f"truncated message: length {length} but only {len(buf) - pos} bytes left", start)
            decoded = _decode(buf, pos, pos + length, NODE if record else GLOBAL_METADATA)
        except _Malformed as exc:
            what = "Node" if record else "GlobalMetadata"
            raise UserError(f"record {record} ({what} at byte {start}): {exc.reason} at byte {exc.offset}",
                            file=str(path), field=exc.field) from None
        if record:
            nodes.append((record, decoded))
        else:
            metadata = decoded
        pos += length
        record += 1
    if metadata is None:
        raise UserError("empty file: no GlobalMetadata record", file=str(path))
    return metadata, nodes

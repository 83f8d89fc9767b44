"""Chakra traces written by the protobuf package from a message description of our own (the fields of Chakra's
et_def.proto that the importer reads), so tests check traffic.chakra against an encoder that is not its decoder."""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal.encoder import _VarintBytes  # protobuf's own varint, for each record's length

COMP, METADATA, COLL = 4, 1, 7
ALL_REDUCE, ALL_TO_ALL = 0, 6
F = descriptor_pb2.FieldDescriptorProto


def _messages() -> tuple[type, type]:
    """GlobalMetadata and Node classes from a FileDescriptorProto written here (package ChakraProtoMsg)."""
    fdp = descriptor_pb2.FileDescriptorProto(name="mpft_test_et_def.proto", package="ChakraProtoMsg",
                                             syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
            if fname.endswith("_val"):  # Chakra's `oneof value`: a value of 0 is written, not left out
                f.oneof_index = 0
        if name == "AttributeProto":
            m.oneof_decl.add(name="value")

    one, many = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("AttributeProto", ("name", 1, F.TYPE_STRING, one, ""), ("int64_val", 9, F.TYPE_INT64, one, ""),
            ("string_val", 29, F.TYPE_STRING, one, ""))
    message("GlobalMetadata", ("version", 1, F.TYPE_STRING, one, ""),
            ("attr", 2, F.TYPE_MESSAGE, many, ".ChakraProtoMsg.AttributeProto"))
    message("IOInfo", ("values", 1, F.TYPE_STRING, one, ""), ("shapes", 2, F.TYPE_STRING, one, ""),
            ("types", 3, F.TYPE_STRING, one, ""))
    message("Node", ("id", 1, F.TYPE_UINT64, one, ""), ("name", 2, F.TYPE_STRING, one, ""),
            ("type", 3, F.TYPE_UINT32, one, ""), ("ctrl_deps", 4, F.TYPE_UINT64, many, ""),
            ("data_deps", 5, F.TYPE_UINT64, many, ""), ("duration_micros", 7, F.TYPE_UINT64, one, ""),
            ("inputs", 8, F.TYPE_MESSAGE, one, ".ChakraProtoMsg.IOInfo"),
            ("outputs", 9, F.TYPE_MESSAGE, one, ".ChakraProtoMsg.IOInfo"),
            ("attr", 10, F.TYPE_MESSAGE, many, ".ChakraProtoMsg.AttributeProto"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"ChakraProtoMsg.{n}"))
                 for n in ("GlobalMetadata", "Node"))


GlobalMetadata, Node = _messages()


def coll(nid: int, comm_type: int, size: int, deps=(), pg: str | None = None):
    node = Node(id=nid, name=f"coll{nid}", type=COLL, data_deps=list(deps))
    for name, value in (("comm_type", comm_type), ("comm_size", size)):
        node.attr.add(name=name, int64_val=value)
    if pg is not None:
        node.attr.add(name="pg_name", string_val=pg)
    return node


def pg_init(nid: int, groups: dict[str, list[int]]):
    """PyTorch's metadata node, its pg_config_info quoted as Chakra's converter leaves it."""
    info = [{"pg_name": name, "pg_desc": f"group {name}", "backend_config": "cuda:nccl", "ranks": ranks}
            for name, ranks in groups.items()]
    node = Node(id=nid, name="## process_group:init ##", type=METADATA)
    node.inputs.values = str([json.dumps(info)])
    return node


def write_ranks(tmp_path: Path, ranks: list[list]) -> list[Path]:
    paths = []
    for r, nodes in enumerate(ranks):
        records = [GlobalMetadata(version="0.0.4").SerializeToString()] + [n.SerializeToString() for n in nodes]
        paths.append(tmp_path / f"pg.{r}.et")
        paths[-1].write_bytes(b"".join(_VarintBytes(len(rec)) + rec for rec in records))
    return paths


TP = {"1": [0, 1, 2, 3], "2": [4, 5, 6, 7]}  # two tensor-parallel groups; "0" is the world (no ranks listed)


def tp_then_world(rank: int, with_metadata: bool = True) -> list:
    """A rank's step: an all-reduce in its own TP group, then an all-to-all over the world."""
    nodes = [pg_init(0, {"0": [], **TP})] if with_metadata else []
    tp = "1" if rank < 4 else "2"
    return nodes + [Node(id=1, name="compute", type=COMP, duration_micros=5),
                    coll(2, ALL_REDUCE, 4000, [1], pg=tp), coll(3, ALL_TO_ALL, 8000, [2], pg="0")]

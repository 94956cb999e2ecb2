"""pprof's `profile.proto`, compiled here at import time with the protobuf runtime.

The schema below is the stable part of pprof's published format (package
`perftools.profiles`, the field numbers and types that `go tool pprof`,
Pyroscope and Parca read), written out for kvprof. It is compiled by
`compile_proto`: a parser for the small subset of proto3 the schema uses
(messages with scalar, string, bool and message fields, `repeated`) that
builds a FileDescriptorProto and hands it to a private descriptor pool.

Why not protoc and a committed `_pb2.py`: generated code is tied to the
protobuf runtime it was generated for (Debian's protoc 3.21 against the
runtime pip installs fails its version check sooner or later), and a build
step would make protoc a dependency of every install. The descriptor API is
the runtime's own, so the two never drift apart.
"""

from __future__ import annotations

import re
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTO = """
syntax = "proto3";
package perftools.profiles;

// A profile: samples, each a stack of locations (leaf first) and values,
// one value per sample_type. Every string is an index into string_table,
// whose entry 0 is "". Serialized and gzip'd on disk.
message Profile {
  repeated ValueType sample_type = 1;
  repeated Sample sample = 2;
  repeated Mapping mapping = 3;
  repeated Location location = 4;
  repeated Function function = 5;
  repeated string string_table = 6;
  int64 drop_frames = 7;
  int64 keep_frames = 8;
  int64 time_nanos = 9;
  int64 duration_nanos = 10;
  ValueType period_type = 11;
  int64 period = 12;
  repeated int64 comment = 13;
  int64 default_sample_type = 14;
}

// What a sample value measures: type and unit, e.g. ("cpu", "nanoseconds").
message ValueType {
  int64 type = 1;
  int64 unit = 2;
}

message Sample {
  repeated uint64 location_id = 1;  // leaf first
  repeated int64 value = 2;
  repeated Label label = 3;
}

// A key with a string (str) or a number (num, in num_unit).
message Label {
  int64 key = 1;
  int64 str = 2;
  int64 num = 3;
  int64 num_unit = 4;
}

message Mapping {
  uint64 id = 1;
  uint64 memory_start = 2;
  uint64 memory_limit = 3;
  uint64 file_offset = 4;
  int64 filename = 5;
  int64 build_id = 6;
  bool has_functions = 7;
  bool has_filenames = 8;
  bool has_line_numbers = 9;
  bool has_inline_frames = 10;
}

// A program location; several lines when functions were inlined into the last.
message Location {
  uint64 id = 1;
  uint64 mapping_id = 2;
  uint64 address = 3;
  repeated Line line = 4;
  bool is_folded = 5;
}

message Line {
  uint64 function_id = 1;
  int64 line = 2;
}

message Function {
  uint64 id = 1;
  int64 name = 2;
  int64 system_name = 3;
  int64 filename = 4;
  int64 start_line = 5;
}
"""

_FDP = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "int64": _FDP.TYPE_INT64,
    "uint64": _FDP.TYPE_UINT64,
    "int32": _FDP.TYPE_INT32,
    "uint32": _FDP.TYPE_UINT32,
    "bool": _FDP.TYPE_BOOL,
    "string": _FDP.TYPE_STRING,
}
_TOKEN = re.compile(r'"[^"]*"|[A-Za-z_][\w.]*|\d+|[{};=]')


class SchemaError(Exception):
    """The schema text is outside the subset compile_proto reads."""


def _tokens(text: str) -> list[str]:
    text = re.sub(r"//[^\n]*", "", text)
    tokens = _TOKEN.findall(text)
    if "".join(tokens) != re.sub(r"\s+", "", text):
        raise SchemaError("unexpected characters in the schema")
    return tokens


def parse_proto(text: str, name: str = "profile.proto") -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto of a proto3 file made of `syntax`, `package` and flat messages."""
    fdp = descriptor_pb2.FileDescriptorProto(name=name, syntax="proto3")
    tokens = _tokens(text)
    i = 0

    def take(expected: str | None = None) -> str:
        nonlocal i
        if i >= len(tokens):
            raise SchemaError(f"schema ends early (expected {expected or 'more'})")
        tok = tokens[i]
        i += 1
        if expected is not None and tok != expected:
            raise SchemaError(f"expected {expected!r}, got {tok!r}")
        return tok

    while i < len(tokens):
        keyword = take()
        if keyword == "syntax":
            take("=")
            if take() != '"proto3"':
                raise SchemaError("only proto3 schemas are read")
            take(";")
        elif keyword == "package":
            fdp.package = take()
            take(";")
        elif keyword == "message":
            msg = fdp.message_type.add(name=take())
            take("{")
            while (tok := take()) != "}":
                label = _FDP.LABEL_OPTIONAL
                if tok == "repeated":
                    label, tok = _FDP.LABEL_REPEATED, take()
                field = msg.field.add(name=take(), label=label)
                take("=")
                field.number = int(take())
                take(";")
                if tok in _SCALARS:
                    field.type = _SCALARS[tok]
                else:  # a message of this file
                    field.type = _FDP.TYPE_MESSAGE
                    field.type_name = f".{fdp.package}.{tok}" if fdp.package else f".{tok}"
                field.json_name = re.sub(r"_(\w)", lambda m: m.group(1).upper(), field.name)
        else:
            raise SchemaError(f"unexpected {keyword!r} at the top level")
    return fdp


def compile_proto(text: str, name: str = "profile.proto") -> dict[str, Any]:
    """Message classes of the schema, by message name (e.g. "Profile")."""
    fdp = parse_proto(text, name)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    prefix = f"{fdp.package}." if fdp.package else ""
    return {
        m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(prefix + m.name))
        for m in fdp.message_type
    }


MESSAGES = compile_proto(PROTO)

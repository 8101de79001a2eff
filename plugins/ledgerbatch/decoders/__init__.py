"""Record formats: one decoder per `source.format`, behind one interface.

A decoder turns one Kafka value into its fields by name, or raises `convert.BadValue` with the
reason the record is quarantined. It is built inside each Spark task from the spec's format name
and options (so per-task state such as a schema cache lives in the task), and must never raise
BadValue for a problem outside the record itself (an unreachable registry fails the batch).
"""
from __future__ import annotations

from typing import Mapping, Protocol

from .avro import AvroDecoder
from .json import JsonDecoder
from .json_schema import JsonSchemaDecoder
from .protobuf import ProtobufDecoder


class Decoder(Protocol):
    def __init__(self, options: dict) -> None: ...

    def decode(self, raw: bytes | None) -> Mapping[str, object]:
        """The record's fields by name (absent fields are NULL); raises BadValue."""


DECODERS: dict[str, type[Decoder]] = {"json": JsonDecoder, "avro": AvroDecoder, "protobuf": ProtobufDecoder,
                                      "json_schema": JsonSchemaDecoder}
REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")


def make_decoder(fmt: str, options: dict | None = None) -> Decoder:
    return DECODERS[fmt](dict(options or {}))

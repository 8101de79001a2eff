"""Record formats: one decoder per `source.format`, behind one interface.

A decoder turns one Kafka value into its fields by name, or raises `convert.BadValue` with the
reason the record is quarantined. It is built inside each Spark task from the spec's format name
and options (so per-task state such as a schema cache lives in the task), and must never raise
BadValue for a problem outside the record itself (an unreachable registry fails the batch).
"""
from __future__ import annotations

from typing import Mapping, Protocol

from ..convert import BadValue

# What a change does to the target (decode_change): upsert its fields, delete its key, or nothing.
UPSERT, DELETE, SKIP = "u", "d", "s"

from .avro import AvroDecoder  # noqa: E402 - the change kinds above come first (debezium.py imports them)
from .debezium import DebeziumDecoder  # noqa: E402
from .debezium_avro import DebeziumAvroDecoder  # noqa: E402
from .json import JsonDecoder  # noqa: E402
from .json_schema import JsonSchemaDecoder
from .protobuf import ProtobufDecoder


class Decoder(Protocol):
    def __init__(self, options: dict) -> None: ...

    def decode(self, raw: bytes | None) -> Mapping[str, object]:
        """The record's fields by name (absent fields are NULL); raises BadValue."""


class ChangeDecoder(Protocol):
    """Pipelines whose records are changes (`format: debezium`, or `target.deletes: true`) decode each
    record, key and value, into (UPSERT | DELETE | SKIP, fields); a DELETE's fields hold the key."""

    def decode_change(self, key: bytes | None, raw: bytes | None) -> tuple[str, Mapping[str, object]]: ...


# `format: debezium` with `source.converter: avro` (spec.py): AvroConverter's envelopes, a decoder of their own.
DEBEZIUM_AVRO = "debezium_avro"
DECODERS: dict[str, type[Decoder]] = {"json": JsonDecoder, "avro": AvroDecoder, "protobuf": ProtobufDecoder,
                                      "json_schema": JsonSchemaDecoder, "debezium": DebeziumDecoder,
                                      DEBEZIUM_AVRO: DebeziumAvroDecoder}
FORMATS = tuple(f for f in DECODERS if f != DEBEZIUM_AVRO)  # what source.format may say
REGISTRY_FORMATS = ("avro", "protobuf", "json_schema", DEBEZIUM_AVRO)
CHANGE_FORMATS = ("debezium", DEBEZIUM_AVRO)  # every record is a change (ChangeDecoder)


def make_decoder(fmt: str, options: dict | None = None) -> Decoder:
    return DECODERS[fmt](dict(options or {}))


def make_change_decoder(fmt: str, options: dict | None = None) -> ChangeDecoder:
    """A change format's own decoder; any other format's with `target.deletes`: a tombstone deletes its key."""
    decoder = make_decoder(fmt, options)
    return decoder if hasattr(decoder, "decode_change") else TombstoneDeletes(decoder)


class TombstoneDeletes:
    """`target.deletes: true`: a tombstone (null value) with a key deletes that key's row, the key being a
    JSON object of the key columns (or Kafka Connect's schema/payload form of one); every other value
    is an upsert decoded by the format's decoder. A tombstone without a key is a bad record."""

    def __init__(self, decoder: Decoder):
        self.decoder = decoder

    def decode(self, raw: bytes | None) -> Mapping[str, object]:
        return self.decoder.decode(raw)

    def decode_change(self, key: bytes | None, raw: bytes | None) -> tuple[str, Mapping[str, object]]:
        if raw is not None:
            return UPSERT, self.decoder.decode(raw)
        if key is None:
            raise BadValue("null value (tombstone) without a key: nothing to delete")
        try:
            doc = JsonDecoder({}).decode(key)
        except BadValue as exc:
            raise BadValue(f"tombstone: the key is not a JSON object of the key columns ({exc})") from None
        if set(doc) == {"schema", "payload"} and isinstance(doc["payload"], dict):
            doc = doc["payload"]
        return DELETE, doc

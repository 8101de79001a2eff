"""Record formats: one decoder per `source.format` (base.py is the interface), and the change decoder
`target.deletes` wraps around any of them.

A decoder turns one Kafka value into its fields by name, or raises `BadValue` with the reason the
record is quarantined. It is built inside each Spark task from the spec's format name and options (so
per-task state such as a schema cache lives in the task), and must never raise BadValue for a problem
outside the record itself (an unreachable registry fails the batch).
"""
from __future__ import annotations

from typing import Mapping

from ledgerbatch.formats.bad_value import BadValue
from ledgerbatch.formats.decoders.avro import AvroDecoder
from ledgerbatch.formats.decoders.base import DELETE, UPSERT, ChangeDecoder, Decoder
from ledgerbatch.formats.decoders.debezium import DebeziumDecoder
from ledgerbatch.formats.decoders.debezium_avro import DebeziumAvroDecoder
from ledgerbatch.formats.decoders.json import JsonDecoder
from ledgerbatch.formats.decoders.json_schema import JsonSchemaDecoder
from ledgerbatch.formats.decoders.protobuf import ProtobufDecoder

# `format: debezium` with `source.converter: avro` (spec/pipeline.py): AvroConverter's envelopes, a decoder of their own.
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

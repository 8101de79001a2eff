"""`format: debezium`: Debezium change events as Kafka Connect's JsonConverter writes them, with or without
the `schema`/`payload` block (`converter.schemas.enable`); `ChangeEvents` is the envelope logic that
Confluent's AvroConverter's events share (debezium_avro.py).

A change is (what it does, the fields it carries) (`decode_change`):

- op `c`, `r`, `u`: an upsert of the row image `after`;
- op `d`: a delete of its key, from `before` (REPLICA IDENTITY DEFAULT or FULL), else from the Kafka key;
- a tombstone (null value, which Debezium writes after each delete for log compaction): skipped;
- anything else (`t` truncate, `m` message, not an envelope): a bad record.

Values are decoded as Debezium encodes them by default. Where the schema block names a field's semantic
type, epoch numbers become dates and timestamps (`io.debezium.time.Date`, `Timestamp`, `MicroTimestamp`,
`NanoTimestamp`, the `*Time` types, Kafka Connect's `Date`/`Timestamp`/`Time`) and `precise` decimals
(base64 of the big-endian two's-complement unscaled value) take the scale from the block's parameters.
Without the block, values pass as they are: decimals must then be strings (`decimal.handling.mode=string`)
and dates and timestamps ISO strings (`ZonedTimestamp` always is one).
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
from abc import ABC, abstractmethod
from decimal import Decimal
from typing import Callable

from ledgerbatch.formats.bad_value import BadValue
from ledgerbatch.formats.convert import show
from ledgerbatch.formats.decoders.base import DELETE, SKIP, UPSERT
from ledgerbatch.formats.decoders.json import JsonDecoder

_EPOCH = dt.datetime(1970, 1, 1)
_DAY = dt.date(1970, 1, 1)
TIMESTAMPS = {"io.debezium.time.Timestamp": 1_000, "org.apache.kafka.connect.data.Timestamp": 1_000,
              "io.debezium.time.MicroTimestamp": 1_000_000, "io.debezium.time.NanoTimestamp": 1_000_000_000}
TIMES = {"io.debezium.time.Time": 1_000, "org.apache.kafka.connect.data.Time": 1_000,
         "io.debezium.time.MicroTime": 1_000_000, "io.debezium.time.NanoTime": 1_000_000_000}
DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
_DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
_OPS = {"c": UPSERT, "r": UPSERT, "u": UPSERT, "d": DELETE}


class ChangeEvents(ABC):
    """The envelope logic every Debezium converter shares; a subclass says how it reads a value and a key.

    `_envelope(raw)` gives the envelope and, per row image (`before`, `after`), the semantic types of its
    fields; `_key(key)` the key's fields and theirs. Field descriptions have Kafka Connect's shape
    (`name`: the semantic type, `type`, `parameters`), which `decode_image` decodes by."""

    @abstractmethod
    def _envelope(self, raw: bytes) -> tuple[dict, Callable[[str], dict[str, dict]]]: ...

    @abstractmethod
    def _key(self, key: bytes) -> tuple[dict, dict[str, dict]]: ...

    def decode(self, raw: bytes | None) -> dict:
        """The row image of an upsert; a delete or a tombstone is not a row (decode_change says what it is)."""
        if raw is None:
            raise BadValue("null value (tombstone)")
        change, fields = self.decode_change(None, raw)
        if change != UPSERT:
            raise BadValue("a delete event is not a row: a debezium pipeline needs target.mode upsert")
        return fields

    def decode_change(self, key: bytes | None, raw: bytes | None) -> tuple[str, dict]:
        if raw is None:
            return SKIP, {}  # the tombstone after a delete: the delete itself came just before
        envelope, fields_of = self._envelope(raw)
        op = envelope.get("op")
        if op not in _OPS:
            if op is None:
                raise BadValue(f"not a Debezium change event: no op field (fields: {', '.join(sorted(envelope)) or 'none'})")
            raise BadValue(f"Debezium op {op!r} is not a row change (c, r, u or d)")
        image_name = "after" if _OPS[op] == UPSERT else "before"
        image = envelope.get(image_name)
        if image is None and op == "d":
            return DELETE, {**self.decode_key(key), **positions(envelope)}
        if not isinstance(image, dict):
            raise BadValue(f"Debezium op {op!r}: {image_name} is {'null' if image is None else 'not an object'}")
        return _OPS[op], {**decode_image(image, fields_of(image_name)), **positions(envelope)}

    def decode_key(self, key: bytes | None) -> dict:
        """The key's fields: Debezium's key is a struct of the primary key columns."""
        if key is None:
            raise BadValue("a Debezium delete without `before` and without a Kafka key: no key to delete")
        try:
            doc, fields = self._key(key)
        except BadValue as exc:
            raise BadValue(f"key: {exc}") from None
        return decode_image(doc, fields)


class DebeziumDecoder(ChangeEvents):
    """JsonConverter's envelopes. Takes no options: the envelope, and its schema block when there is one,
    describe each value."""

    def __init__(self, options: dict):
        self._json = JsonDecoder({})

    def _envelope(self, raw: bytes) -> tuple[dict, Callable[[str], dict[str, dict]]]:
        envelope, schema = _unwrap(self._json.decode(raw))
        return envelope, lambda image_name: _fields(schema, image_name)

    def _key(self, key: bytes) -> tuple[dict, dict[str, dict]]:
        doc, schema = _unwrap(self._json.decode(key))
        return doc, _fields(schema, None)


def _unwrap(doc: dict) -> tuple[dict, dict | None]:
    """(payload, schema block) of a JsonConverter document with schemas.enable, else (doc, None)."""
    if set(doc) == {"schema", "payload"} and isinstance(doc["schema"], dict):
        if not isinstance(doc["payload"], dict):
            raise BadValue("the payload of the schema/payload block is not an object")
        return doc["payload"], doc["schema"]
    return doc, None


def _fields(schema: dict | None, name: str | None) -> dict[str, dict]:
    """The schema block's fields of the struct `name` (None: the block itself is the struct), by field name."""
    if schema is None:
        return {}
    struct = schema
    if name is not None:
        struct = next((f for f in schema.get("fields") or () if f.get("field") == name), None) or {}
    return {f.get("field"): f for f in struct.get("fields") or () if isinstance(f, dict)}


def positions(envelope: dict) -> dict:
    """Where the change happened, as the columns `target.version` may order by (spec ENVELOPE_VERSIONS):
    the source's log position and commit time, and when the connector saw it."""
    source = envelope.get("source")
    source = source if isinstance(source, dict) else {}
    return {"_source_lsn": source.get("lsn"), "_source_ts_ms": source.get("ts_ms"), "_ts_ms": envelope.get("ts_ms")}


def decode_image(image: dict, fields: dict[str, dict]) -> dict:
    """A row image with the values the schema block gives a meaning to decoded; the rest as they are."""
    out = dict(image)
    for name, field in fields.items():
        value = image.get(name)
        if value is not None and field.get("name"):
            try:
                out[name] = _logical(field, value)
            except BadValue as exc:
                raise BadValue(f"field {name}: {exc}") from None
    return out


def _logical(field: dict, value):
    semantic = field["name"]
    if semantic in TIMESTAMPS:
        per_second = TIMESTAMPS[semantic]
        return _EPOCH + dt.timedelta(seconds=_integer(value, semantic) // per_second,
                                     microseconds=(value % per_second) * 1_000_000 // per_second)
    if semantic in DATES:
        return _DAY + dt.timedelta(days=_integer(value, semantic))
    if semantic in TIMES:
        per_second = TIMES[semantic]
        micros = _integer(value, semantic) * 1_000_000 // per_second
        return (dt.datetime.min + dt.timedelta(microseconds=micros)).time()
    if semantic == _DECIMAL and isinstance(value, str) and field.get("type") == "bytes":
        scale = int((field.get("parameters") or {}).get("scale", 0))
        return _unscaled(value, scale)
    if semantic == VARIABLE_DECIMAL and isinstance(value, dict):
        return _unscaled(value.get("value"), _integer(value.get("scale"), semantic))
    return value


def _integer(value, semantic: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadValue(f"expected an integer for {semantic}, got {show(value)}")
    return value


def _unscaled(data, scale: int) -> Decimal:
    """Debezium's `precise` decimal: the unscaled value, big-endian two's complement (base64 text in JSON,
    bytes in Avro)."""
    if isinstance(data, str):
        try:
            data = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise BadValue(f"{show(data)} is not a base64 decimal") from None
    if not isinstance(data, bytes):
        raise BadValue(f"expected a base64 decimal, got {show(data)}")
    return Decimal(int.from_bytes(data, "big", signed=True)).scaleb(-scale)

"""`format: debezium` with `source.converter: avro`: Debezium change events written by Confluent's
AvroConverter (`key.converter` and `value.converter` `io.confluent.connect.avro.AvroConverter`). Key and value
are in the Confluent wire format; the value's writer schema is Debezium's `Envelope` record.

Values are read as `format: avro` reads them (avro.WriterSchemas: each with its writer schema, fetched and
parsed once per id) and judged as JsonConverter's envelopes are (debezium.ChangeEvents). AvroConverter keeps a
field's Kafka Connect semantic type as `connect.name` (and `connect.parameters`) on the field's Avro type:
those become the field descriptions ChangeEvents decodes by (io.debezium.time.*, VariableScaleDecimal).
Where AvroConverter also wrote an Avro logicalType (Connect's Decimal, Date, Time, Timestamp), fastavro has
decoded the value already, so the field is left as it is.
"""
from __future__ import annotations

import json
from typing import Callable

from ledgerbatch.formats.bad_value import BadValue
from ledgerbatch.formats.decoders.avro import WriterSchemas, spark_type
from ledgerbatch.formats.decoders.debezium import DATES, TIMES, TIMESTAMPS, VARIABLE_DECIMAL, ChangeEvents

# Spec types of the semantic types a spec without `schema:` meets (the rest: avro.spark_type of the Avro type).
_COLUMN_TYPES = {**dict.fromkeys(TIMESTAMPS, "TIMESTAMP"), "io.debezium.time.ZonedTimestamp": "TIMESTAMP",
                 **dict.fromkeys(DATES, "DATE"),
                 **dict.fromkeys(TIMES, "STRING"),  # no TIME type: a time of day as ISO text
                 VARIABLE_DECIMAL: "STRING"}  # each value has its own scale: exact as text


class DebeziumAvroDecoder(ChangeEvents):
    def __init__(self, options: dict):
        self._writers = WriterSchemas(options)
        self._described = {}  # schema id -> semantic_fields of the writer schema

    def _envelope(self, raw: bytes) -> tuple[dict, Callable[[str], dict[str, dict]]]:
        envelope, sid = self._record(raw)
        described = self._fields(sid)
        return envelope, lambda image_name: described.get(image_name, {})

    def _key(self, key: bytes) -> tuple[dict, dict[str, dict]]:
        doc, sid = self._record(key)
        return doc, self._fields(sid)[None]

    def _record(self, raw: bytes) -> tuple[dict, int]:
        datum, sid = self._writers.read(raw)
        if not isinstance(datum, dict):
            raise BadValue(f"value is an Avro {type(datum).__name__}, not a record")
        return datum, sid

    def _fields(self, sid: int) -> dict:
        described = self._described.get(sid)
        if described is None:
            described = self._described[sid] = semantic_fields(json.loads(self._writers.text(sid)))
        return described


def semantic_fields(record: dict) -> dict[str | None, dict[str, dict]]:
    """Field descriptions in Kafka Connect's shape (`name`, `type`, `parameters`) of the fields that carry a
    semantic type without an Avro logicalType: of the record itself (None) and of each of its record fields
    (`before`, `after`)."""
    names = named_types(record)
    out = {None: _described(record, names)}
    for field in record.get("fields", ()):
        t = resolve(field["type"], names)
        if isinstance(t, dict) and t.get("type") == "record":
            out[field["name"]] = _described(t, names)
    return out


def _described(record: dict, names: dict) -> dict[str, dict]:
    out = {}
    for field in record.get("fields", ()):
        t = resolve(field["type"], names)
        if isinstance(t, dict) and "connect.name" in t and "logicalType" not in t:
            out[field["name"]] = {"name": t["connect.name"], "type": t["type"],
                                  "parameters": t.get("connect.parameters") or {}}
    return out


def named_types(schema, namespace: str = "", names: dict | None = None) -> dict[str, dict]:
    """The named types a schema defines, by full and by short name (a later use refers to one by name)."""
    names = {} if names is None else names
    if isinstance(schema, list):
        for branch in schema:
            named_types(branch, namespace, names)
    elif isinstance(schema, dict):
        if schema.get("type") in ("record", "enum", "fixed") and "name" in schema:
            given, _, short = schema["name"].rpartition(".")  # a dotted name is a full name
            namespace = given or schema.get("namespace", namespace)
            names[f"{namespace}.{short}" if namespace else short] = names[short] = schema
        for field in schema.get("fields", ()):
            named_types(field["type"], namespace, names)
        for inner in ("items", "values"):
            if inner in schema:
                named_types(schema[inner], namespace, names)
        if isinstance(schema.get("type"), (dict, list)):
            named_types(schema["type"], namespace, names)
    return names


def resolve(t, names: dict):
    """A field's type with a nullable union unwrapped and a reference to a named type looked up."""
    if isinstance(t, list):
        branches = [b for b in t if b != "null"]
        t = branches[0] if len(branches) == 1 else t
    return names.get(t, t) if isinstance(t, str) else t


def columns_ddl(schema) -> str:
    """The spec columns of a subject's latest Envelope schema (for specs without `schema:`): the fields of
    its `after` record, typed by their semantic type where they have one."""
    envelope = json.loads(schema.schema_str)
    names = named_types(envelope)
    after = next((resolve(f["type"], names) for f in envelope.get("fields", ()) if f.get("name") == "after"), None) \
        if isinstance(envelope, dict) else None
    if not isinstance(after, dict) or after.get("type") != "record":
        raise ValueError("the subject's latest Avro schema is not a Debezium envelope (no `after` record)")
    return ", ".join(f"{f['name']} {_column_type(resolve(f['type'], names))}" for f in after["fields"])


def _column_type(t) -> str:
    if isinstance(t, dict) and t.get("connect.name") in _COLUMN_TYPES and "logicalType" not in t:
        return _COLUMN_TYPES[t["connect.name"]]
    return spark_type(t)

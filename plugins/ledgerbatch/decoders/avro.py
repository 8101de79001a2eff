"""`format: avro`: Confluent wire format, each value decoded with its writer schema (fastavro, through
confluent-kafka's AvroDeserializer) into a record whose fields are matched to the spec's columns by name."""
from __future__ import annotations

from ..convert import BadValue
from .registry import WRITER_SCHEMA_ONLY, decode_framed, registry_client


class AvroDecoder:
    def __init__(self, options: dict):
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        # No reader schema: the writer's own, so a field added or removed later is simply there or not.
        self._deserialize = AvroDeserializer(registry_client(options), conf=WRITER_SCHEMA_ONLY)

    def decode(self, raw: bytes | None) -> dict:
        record = decode_framed(raw, self._deserialize)
        if not isinstance(record, dict):
            raise BadValue(f"value is an Avro {type(record).__name__}, not a record")
        return record


_PRIMITIVES = {"string": "STRING", "int": "INT", "long": "BIGINT", "float": "FLOAT", "double": "DOUBLE",
               "boolean": "BOOLEAN", "bytes": "BINARY", "fixed": "BINARY", "enum": "STRING"}
_LOGICAL = {"date": "DATE", "timestamp-millis": "TIMESTAMP", "timestamp-micros": "TIMESTAMP",
            "local-timestamp-millis": "TIMESTAMP", "local-timestamp-micros": "TIMESTAMP", "uuid": "STRING"}


def columns_ddl(schema) -> str:
    """The Spark DDL of an Avro record schema's fields (for specs without `schema:`)."""
    import json

    record = json.loads(schema.schema_str)
    if not isinstance(record, dict) or record.get("type") != "record":
        raise ValueError("the subject's latest Avro schema is not a record")
    return ", ".join(f"{f['name']} {_type(f['type'])}" for f in record["fields"])


def _type(t) -> str:
    if isinstance(t, list):  # a union: ["null", X] is a nullable X, anything wider a VARIANT
        branches = [b for b in t if b != "null"]
        return _type(branches[0]) if len(branches) == 1 else "VARIANT"
    if isinstance(t, str):
        return _PRIMITIVES.get(t, "VARIANT")  # a named type defined elsewhere in the schema
    logical = t.get("logicalType")
    if logical == "decimal":
        return f"DECIMAL({t['precision']},{t.get('scale', 0)})"
    if logical in _LOGICAL:
        return _LOGICAL[logical]
    kind = t["type"]
    if kind == "record":
        return "STRUCT<" + ", ".join(f"{f['name']}: {_type(f['type'])}" for f in t["fields"]) + ">"
    if kind == "array":
        return f"ARRAY<{_type(t['items'])}>"
    if kind == "map":
        return f"MAP<STRING, {_type(t['values'])}>"
    return _type(kind)

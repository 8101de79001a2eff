"""`format: json_schema`: Confluent wire format, JSON validated against its writer schema (confluent-kafka's
JSONDeserializer); numbers with a fraction stay exact (Decimal), as in `format: json`."""
from __future__ import annotations

import json
from decimal import Decimal

from ledgerbatch.formats.bad_value import BadValue
from ledgerbatch.formats.decoders.confluent_wire import WRITER_SCHEMA_ONLY, decode_framed, registry_client
from ledgerbatch.formats.decoders.json import reject_constant


def _loads(payload: bytes):
    return json.loads(payload, parse_float=Decimal, parse_constant=reject_constant)


class JsonSchemaDecoder:
    def __init__(self, options: dict):
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        self._deserialize = JSONDeserializer(None, schema_registry_client=registry_client(options),
                                            conf=WRITER_SCHEMA_ONLY, json_decode=_loads)

    def decode(self, raw: bytes | None) -> dict:
        obj = decode_framed(raw, self._deserialize)
        if not isinstance(obj, dict):
            raise BadValue(f"value is JSON {type(obj).__name__}, not an object")
        return obj


_FORMATS = {"date-time": "TIMESTAMP", "date": "DATE"}


def columns_ddl(schema) -> str:
    """The Spark DDL of a JSON Schema object's properties (for specs without `schema:`)."""
    doc = json.loads(schema.schema_str)
    if doc.get("type") != "object" or not doc.get("properties"):
        raise ValueError("the subject's latest JSON Schema is not an object with properties")
    return ", ".join(f"{name} {_type(prop)}" for name, prop in doc["properties"].items())


def _type(prop: dict) -> str:
    kind = prop.get("type")
    if isinstance(kind, list):  # ["string", "null"] is a nullable string
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind == "string":
        return _FORMATS.get(prop.get("format"), "STRING")
    if kind == "integer":
        return "BIGINT"
    if kind == "number":
        return "DOUBLE"
    if kind == "boolean":
        return "BOOLEAN"
    if kind == "array" and isinstance(prop.get("items"), dict):
        return f"ARRAY<{_type(prop['items'])}>"
    if kind == "object" and prop.get("properties"):
        return "STRUCT<" + ", ".join(f"{n}: {_type(p)}" for n, p in prop["properties"].items()) + ">"
    return "VARIANT"

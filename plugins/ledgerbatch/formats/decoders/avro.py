"""`format: avro`: Confluent wire format, each value decoded with its writer schema into a record whose
fields are matched to the spec's columns by name.

confluent-kafka's AvroDeserializer resolves and parses each writer schema (by id, references included,
cached); the values are then read by fastavro with that parsed schema. The deserializer's own
per-value path also expands the schema for data-contract rules on every call, which costs more than
the decoding itself (measured: docs/format-avro.md).
"""
from __future__ import annotations

from ledgerbatch.formats.bad_value import BadValue
from ledgerbatch.formats.decoders.confluent_wire import WRITER_SCHEMA_ONLY, decode_framed, registry_client, schema_id


class WriterSchemas:
    """Reads wire-format values with their writer schemas: each schema fetched (by id) and parsed once."""

    def __init__(self, options: dict):
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        self._client = registry_client(options)
        self._resolver = AvroDeserializer(self._client, conf=WRITER_SCHEMA_ONLY)
        self._parsed = {}  # schema id -> parsed writer schema; no reader schema, so fields come and go freely

    def read(self, raw: bytes | None) -> tuple[object, int]:
        """(the datum, its writer schema id); a bad value raises BadValue, an outage RegistryUnavailable."""
        return decode_framed(raw, self._read), schema_id(raw)

    def text(self, sid: int) -> str:
        """The writer schema's JSON text (from the client's cache once read)."""
        return self.registered(sid).schema_str

    def registered(self, sid: int):
        """The writer schema as the registry has it (text and references), from the client's cache once read."""
        return self._client.get_schema(sid)

    def _read(self, raw: bytes):
        from confluent_kafka.schema_registry import dual_schema_id_deserializer
        from confluent_kafka.schema_registry.common.avro import AVRO_TYPE
        from confluent_kafka.schema_registry.serde import SchemaId
        from fastavro import schemaless_reader

        sid = SchemaId(AVRO_TYPE)
        payload = dual_schema_id_deserializer(raw, None, sid)
        writer = self._parsed.get(sid.id)
        if writer is None:
            writer = self._parsed[sid.id] = self._resolver._get_parsed_schema(self._client.get_schema(sid.id))
        return schemaless_reader(payload, writer, None)


class AvroDecoder:
    def __init__(self, options: dict):
        self.writers = WriterSchemas(options)  # formats/avro_columns.py reads whole chunks with them

    def decode(self, raw: bytes | None) -> dict:
        record, _ = self.writers.read(raw)
        if not isinstance(record, dict):
            raise BadValue(f"value is an Avro {type(record).__name__}, not a record")
        return record


_PRIMITIVES = {"string": "STRING", "int": "INT", "long": "BIGINT", "float": "FLOAT", "double": "DOUBLE",
               "boolean": "BOOLEAN", "bytes": "BINARY", "fixed": "BINARY", "enum": "STRING"}
_LOGICAL = {"date": "DATE", "timestamp-millis": "TIMESTAMP", "timestamp-micros": "TIMESTAMP",
            "local-timestamp-millis": "TIMESTAMP", "local-timestamp-micros": "TIMESTAMP", "uuid": "STRING",
            "time-millis": "STRING", "time-micros": "STRING"}  # no TIME type: a time of day as ISO text


def columns_ddl(schema) -> str:
    """The Spark DDL of an Avro record schema's fields (for specs without `schema:`)."""
    import json

    record = json.loads(schema.schema_str)
    if not isinstance(record, dict) or record.get("type") != "record":
        raise ValueError("the subject's latest Avro schema is not a record")
    return ", ".join(f"{f['name']} {spark_type(f['type'])}" for f in record["fields"])


def spark_type(t) -> str:
    """The spec type of an Avro type (a name, a union or a type object)."""
    if isinstance(t, list):  # a union: ["null", X] is a nullable X, anything wider a VARIANT
        branches = [b for b in t if b != "null"]
        return spark_type(branches[0]) if len(branches) == 1 else "VARIANT"
    if isinstance(t, str):
        return _PRIMITIVES.get(t, "VARIANT")  # a named type defined elsewhere in the schema
    logical = t.get("logicalType")
    if logical == "decimal":
        return f"DECIMAL({t['precision']},{t.get('scale', 0)})"
    if logical in _LOGICAL:
        return _LOGICAL[logical]
    kind = t["type"]
    if kind == "record":
        return "STRUCT<" + ", ".join(f"{f['name']}: {spark_type(f['type'])}" for f in t["fields"]) + ">"
    if kind == "array":
        return f"ARRAY<{spark_type(t['items'])}>"
    if kind == "map":
        return f"MAP<STRING, {spark_type(t['values'])}>"
    return spark_type(kind)

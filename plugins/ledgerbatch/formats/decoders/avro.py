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


def unbounded_items(parsed) -> str | None:
    """Why values of a (fastavro-parsed) writer schema could claim any number of items, or None.

    An Avro array is a count and then its items: items of a type that takes no bytes (null, an empty
    record, fixed of size 0) let a value of a few bytes claim 2^60 of them, which the reader would build
    one by one. Any other item takes at least a byte, so a value holds at most as many items as bytes;
    map entries always do (each has a key)."""
    named = parsed.get("__named_schemas", {}) if isinstance(parsed, dict) else {}

    def zero_size(t, seen=frozenset()) -> bool:
        if isinstance(t, str):
            return t == "null" or (t in named and t not in seen and zero_size(named[t], seen | {t}))
        if not isinstance(t, dict):
            return False  # a union: its branch index takes a byte
        kind = t.get("type")
        if kind in ("record", "error"):
            return all(zero_size(f["type"], seen) for f in t.get("fields", ()))
        if kind == "fixed":
            return t.get("size") == 0
        return kind not in ("array", "map", "enum") and zero_size(kind, seen)

    def find(t, where: str, seen: frozenset):
        if isinstance(t, list):
            return next((r for b in t if (r := find(b, where, seen))), None)
        if isinstance(t, str):
            return find(named[t], where, seen | {t}) if t in named and t not in seen else None
        if not isinstance(t, dict):
            return None
        kind = t.get("type")
        if kind == "array":
            if zero_size(t["items"]):
                items = t["items"] if isinstance(t["items"], str) else t["items"].get("name", t["items"].get("type"))
                return f"{where or 'the value'} is an array of items that take no bytes ({items})"
            return find(t["items"], f"{where}[]", seen)
        if kind == "map":
            return find(t["values"], f"{where}{{}}", seen)
        if kind in ("record", "error"):
            inner = seen | {t.get("name")}
            return next((r for f in t.get("fields", ()) if (r := find(f["type"], f"{where}.{f['name']}".lstrip("."),
                                                                       inner))), None)
        return find(kind, where, seen) if isinstance(kind, (dict, list, str)) else None  # {"type": <a type>}

    return find(parsed, "", frozenset())


def recursive(parsed) -> bool:
    """Whether a (fastavro-parsed) writer schema has a type that contains itself (a list, a tree). fastavro's
    compiled reader recurses in C once a level, so a value of a few KB nested that deep crashes the process;
    such schemas are read with its pure-Python reader, whose RecursionError makes a bad record."""
    named = parsed.get("__named_schemas", {}) if isinstance(parsed, dict) else {}

    def reaches(t, path: frozenset) -> bool:
        if isinstance(t, str):
            return t in path or (t in named and reaches(named[t], path | {t}))
        if isinstance(t, list):
            return any(reaches(b, path) for b in t)
        if not isinstance(t, dict):
            return False
        name = t.get("name") if t.get("type") in ("record", "error") else None
        inner = path | {name} if name else path
        return any(reaches(x, inner) for x in (t.get("items"), t.get("values"), t.get("type") if isinstance(
            t.get("type"), (dict, list)) else None, *(f["type"] for f in t.get("fields", ()))) if x is not None)

    return reaches(parsed, frozenset())


class WriterSchemas:
    """Reads wire-format values with their writer schemas: each schema fetched (by id) and parsed once."""

    def __init__(self, options: dict):
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        self._client = registry_client(options)
        self._resolver = AvroDeserializer(self._client, conf=WRITER_SCHEMA_ONLY)
        self._parsed = {}  # schema id -> parsed writer schema; no reader schema, so fields come and go freely
        self._refused = {}  # schema id -> why its values are not read (unbounded_items)
        self._readers = {}  # schema id -> fastavro's compiled reader, or its pure-Python one (recursive)

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
        from fastavro import _read_py, schemaless_reader

        sid = SchemaId(AVRO_TYPE)
        payload = dual_schema_id_deserializer(raw, None, sid)
        writer = self._parsed.get(sid.id)
        if writer is None:
            writer = self._resolver._get_parsed_schema(self._client.get_schema(sid.id))
            self._refused[sid.id] = unbounded_items(writer)
            self._readers[sid.id] = _read_py.schemaless_reader if recursive(writer) else schemaless_reader
            self._parsed[sid.id] = writer
        if self._refused[sid.id]:
            raise BadValue(f"writer schema id {sid.id} is not read: {self._refused[sid.id]}, so a value of a few "
                           f"bytes could claim any number of them")
        try:
            return self._readers[sid.id](payload, writer, None)
        except RecursionError:
            raise BadValue(f"value nested too deeply for writer schema id {sid.id} (a recursive type)") from None


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

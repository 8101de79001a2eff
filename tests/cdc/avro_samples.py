"""The AvroConverter samples (samples/avro-precise.jsonl and avro-schemas.json, captured from real Debezium by
make_samples.py) replayed against another registry: each schema registered there, and each key's and value's
schema id rewritten to the id the same schema has there. The bytes after the id stay AvroConverter's own."""
from __future__ import annotations

import io
import json

from .make_samples import AVRO_SAMPLES, AVRO_SCHEMAS
from .test_samples import SAMPLES, load


def schemas() -> list[dict]:
    """Every schema of the capture (id, subject, version, schema text), in id order."""
    return sorted(json.loads((SAMPLES / AVRO_SCHEMAS).read_text()), key=lambda s: s["id"])


def register(registry_url: str, subject: str, text: str) -> int:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    return SchemaRegistryClient({"url": registry_url}).register_schema(subject, Schema(text, "AVRO"))


def load_avro(registry_url: str) -> list[dict]:
    """The sample lines (test_samples.load) with their ids valid in the registry at `registry_url`."""
    ids = {s["id"]: register(registry_url, s["subject"], s["schema"]) for s in schemas()}
    lines = load(AVRO_SAMPLES)
    for line in lines:
        for part in ("key", "value"):
            if line[part] is not None:
                line[part] = with_id(line[part], ids[int.from_bytes(line[part][1:5], "big")])
    return lines


def with_id(raw: bytes, sid: int) -> bytes:
    return raw[:1] + sid.to_bytes(4, "big") + raw[5:]


def edited(registry_url: str, raw: bytes, **changes) -> bytes:
    """A captured value with envelope fields changed (e.g. before=None: a delete under REPLICA IDENTITY
    NOTHING), written again with its own writer schema and id."""
    import fastavro
    from confluent_kafka.schema_registry import SchemaRegistryClient

    sid = int.from_bytes(raw[1:5], "big")
    schema = fastavro.parse_schema(json.loads(SchemaRegistryClient({"url": registry_url}).get_schema(sid).schema_str))
    envelope = fastavro.schemaless_reader(io.BytesIO(raw[5:]), schema, None)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, {**envelope, **changes})
    return raw[:5] + out.getvalue()

"""Capture real Debezium events of scenario.py into tests/cdc/samples/, for decoder tests that run without a JVM.

    .venv/bin/python -m tests.cdc.make_samples [avro]   # as root on this machine kind, or with the CDC cluster up

One file per JsonConverter setting: {schemas,noschemas}-{precise,string}.jsonl; and avro-precise.jsonl from
Confluent's AvroConverter against the dev registry, whose schemas go to avro-schemas.json (`avro`: only these).
See samples/README.md.
"""
from __future__ import annotations

import base64
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "plugins"))

from tests.cdc import scenario, source_db  # noqa: E402
from tests.cdc.capture import Capture, debezium_properties  # noqa: E402

SAMPLES = Path(__file__).resolve().parent / "samples"
DB = "ledgerbatch_cdc_samples"
TABLES = {"accounts": True, "accounts_default": False}  # table -> REPLICA IDENTITY FULL?
SETTINGS = [(True, "precise"), (True, "string"), (False, "precise"), (False, "string")]
AVRO_SAMPLES, AVRO_SCHEMAS = "avro-precise.jsonl", "avro-schemas.json"


def file_name(schemas_enable: bool, decimal_mode: str) -> str:
    return f"{'schemas' if schemas_enable else 'noschemas'}-{decimal_mode}.jsonl"


def keep(table: str, expected: scenario.Expected) -> bool:
    """Every event of `accounts`; of `accounts_default` only what differs from it (updates, deletes, tombstones)."""
    return TABLES[table] or expected.op not in ("r", "c")


def capture_one(broker, schemas_enable: bool, decimal_mode: str, n: int, registry=None) -> list[dict]:
    """The events of the scenario; with a registry (ledgerbatch.devregistry.DevRegistry) through AvroConverter,
    followed by scenario.EVOLUTION on `accounts`."""
    db = source_db.fresh_database(DB)
    with contextlib.closing(source_db.connect(db)) as conn:
        for table, full in TABLES.items():
            scenario.create_table(conn, table, replica_identity_full=full)
    topics = {t: f"shop.public.{t}" for t in TABLES}
    for topic in topics.values():
        broker.create_topic(topic, 1)  # one partition: offsets are the source order
    avro = {"converter.schema.registry.url": registry.url} if registry else {}
    props = debezium_properties(dbname=db, tables=[f"public.{t}" for t in TABLES], slot=f"lb_cdc_samples_{n}",
                                topic_prefix="shop", schemas_enable=schemas_enable, decimal_mode=decimal_mode, **avro)
    lines = []
    with Capture(props, broker.bootstrap_servers, tempfile.mkdtemp(prefix="ledgerbatch-cdc-samples-"),
                 engine_format="avro" if registry else "json") as cap:
        for topic in topics.values():
            cap.read_until(topic, len(scenario.SNAPSHOT))
        with contextlib.closing(source_db.connect(db)) as conn:
            for table in TABLES:
                scenario.apply_transactions(conn, table)
            if registry:
                scenario.apply_evolution(conn, "accounts")
        for table, full in TABLES.items():
            expected = scenario.expected_events(full) + (scenario.evolution_events() if registry and full else [])
            events = cap.read_until(topics[table], len(expected), timeout=60)
            assert len(events) == len(expected), (table, len(events), len(expected))
            for e, x in zip(events, expected):
                key, envelope = avro_payloads(e, registry) if registry else (e.key_payload, e.payload)
                assert key == {"id": x.key} and (e.value is None) == (x.op is None), (e, x)
                assert x.op is None or envelope["op"] == x.op, (envelope, x)
                if keep(table, x):
                    lines.append({
                        "table": table, "replica_identity": "full" if full else "default",
                        "topic": e.topic, "partition": e.partition, "offset": e.offset,
                        "op": x.op, "tx": x.tx,
                        "key_b64": base64.b64encode(e.key).decode(),
                        "value_b64": None if e.value is None else base64.b64encode(e.value).decode(),
                        "expect_key": {"id": x.key},
                        "expect_before": scenario.as_text(x.before),
                        "expect_after": scenario.as_text(x.after),
                    })
        code = cap.stop()
        if code:
            raise RuntimeError(f"the capture exited {code}:\n{cap.log_tail()}")
    return lines


def avro_payloads(event, registry) -> tuple[dict, dict | None]:
    """(key, envelope) of an AvroConverter event, read with the writer schemas its ids name."""
    import io

    import fastavro

    def read(data):
        schema = json.loads(registry._schemas[int.from_bytes(data[1:5], "big")]["schema"])
        return fastavro.schemaless_reader(io.BytesIO(data[5:]), fastavro.parse_schema(schema), None)
    return read(event.key), None if event.value is None else read(event.value)


def registry_schemas(registry) -> list[dict]:
    """Every schema the capture registered: id, subject, version, text."""
    return [{"id": i, "subject": subject, "version": v, "schema": registry._schemas[i]["schema"]}
            for subject, ids in sorted(registry._subjects.items()) for v, i in enumerate(ids, 1)]


def main() -> None:
    from ledgerbatch.dev.kafka import LocalKafka
    from ledgerbatch.dev.registry import DevRegistry

    print(source_db.ensure_cluster())
    SAMPLES.mkdir(exist_ok=True)
    started = time.monotonic()
    with LocalKafka(1) as broker, DevRegistry() as registry:
        lines = capture_one(broker, True, "precise", len(SETTINGS), registry)
        (SAMPLES / AVRO_SCHEMAS).write_text(json.dumps(registry_schemas(registry), indent=1) + "\n")
    (SAMPLES / AVRO_SAMPLES).write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    print(f"tests/cdc/samples/{AVRO_SAMPLES}: {len(lines)} events in {time.monotonic() - started:.1f} s")
    for n, (schemas_enable, decimal_mode) in enumerate(SETTINGS if sys.argv[1:] != ["avro"] else []):
        started = time.monotonic()
        with LocalKafka(1) as broker:  # a fresh broker each time: the same topic names, offsets from 0
            lines = capture_one(broker, schemas_enable, decimal_mode, n)
        path = SAMPLES / file_name(schemas_enable, decimal_mode)
        path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
        print(f"{path.relative_to(REPO)}: {len(lines)} events in {time.monotonic() - started:.1f} s")
    with contextlib.closing(source_db.connect()) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


if __name__ == "__main__":
    main()

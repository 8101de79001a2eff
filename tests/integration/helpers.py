"""Test helpers: produce known records and check the exactly-once invariants with plain SQL."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from sqlalchemy import text

REPO = Path(__file__).resolve().parents[2]


def produce(bootstrap: str, topic: str, records: list[tuple[int, bytes | None]], transactional_id: str | None = None,
            keys: list[bytes | None] | None = None, timestamp_ms: int = 0) -> list[tuple[int, int, bytes | None]]:
    """Produce (partition, value) pairs (with `keys`, else the key is the record's index; with
    `timestamp_ms`, records stamped with it as a producer's clock would); returns (partition, offset, value)
    as acknowledged by the broker."""
    conf = {"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3}
    if transactional_id:
        conf["transactional.id"] = transactional_id
    producer = Producer(conf)
    acked = []

    def on_delivery(err, msg):
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.value()))

    if transactional_id:
        producer.init_transactions(30)
        producer.begin_transaction()
    for i, (partition, value) in enumerate(records):
        key = str(i).encode() if keys is None else keys[i]
        producer.produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery, timestamp=timestamp_ms)
        producer.poll(0)
    if transactional_id:
        producer.commit_transaction(30)
    assert producer.flush(30) == 0
    assert len(acked) == len(records)
    return acked


def order_value(i: int, amount: str = "1.00") -> bytes:
    return (f'{{"order_id":"o-{i}","customer":"c-{i % 7}","amount":"{amount}",'
            f'"ts":"2026-11-21T10:00:00Z"}}').encode()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tests", "isolation.level": "read_committed"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False) for p in range(partitions)}
    finally:
        c.close()


def delete_records(bootstrap: str, topic: str, partition: int, before: int) -> None:
    """Advance the partition's log start to `before` (Kafka's DeleteRecords), as retention would."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the futures resolve
    for future in admin.delete_records([TopicPartition(topic, partition, before)]).values():
        future.result(30)


def assert_exactly_once(engine, pipeline, bootstrap: str, good: set[tuple[int, int]], bad: set[tuple[int, int]]) -> None:
    """Target = good coordinates once each; quarantine = bad ones (bad records, rows the target refused) once
    each; cursors at the end; ranges tile."""
    with engine.connect() as conn:
        rows = conn.execute(text(f'SELECT _partition, _offset FROM public."{pipeline.table}"')).all()
        coords = [(r[0], r[1]) for r in rows]
        assert len(coords) == len(set(coords)), "duplicate source coordinates in the target"
        assert set(coords) == good, f"target differs: missing {sorted(good - set(coords))[:5]}, extra {sorted(set(coords) - good)[:5]}"

        q = conn.execute(text('SELECT partition, "offset" FROM ledger.quarantine WHERE pipeline = :p'), {"p": pipeline.name}).all()
        assert sorted((r[0], r[1]) for r in q) == sorted(bad)

        cursors = {r.partition: r for r in conn.execute(
            text("SELECT partition, start_offset, next_offset FROM ledger.cursors WHERE pipeline = :p"), {"p": pipeline.name})}
        ends = end_offsets(bootstrap, pipeline.topic, pipeline.partitions)
        assert {p: c.next_offset for p, c in cursors.items()} == {p: hi for p, (_, hi) in ends.items()}

        for p, c in cursors.items():
            ranges = conn.execute(text(  # delivered, or skipped or lost with a ledger row that says so
                "SELECT r.from_offset, r.until_offset FROM ledger.batch_ranges r JOIN ledger.batches b USING (batch_id) "
                "WHERE b.pipeline = :p AND r.partition = :part AND b.status = 'committed' AND b.kind = 'live' "
                "UNION ALL SELECT from_offset, until_offset FROM ledger.lost_ranges WHERE pipeline = :p "
                "AND partition = :part ORDER BY 1"), {"p": pipeline.name, "part": p}).all()
            position = c.start_offset
            for r in ranges:
                assert r.from_offset == position, f"partition {p}: gap or overlap at {position}"
                position = r.until_offset
            assert position == c.next_offset

        totals = conn.execute(text(
            "SELECT count(*) FILTER (WHERE status IN ('planned', 'staged', 'failed')) AS unfinished, "
            "coalesce(sum(records_read) FILTER (WHERE ok), 0) AS r, coalesce(sum(rows_written) FILTER (WHERE ok), 0) AS w, "
            "coalesce(sum(rows_quarantined + rows_rejected) FILTER (WHERE ok), 0) AS q "
            "FROM (SELECT *, status = 'committed' AND kind IN ('live', 'backfill') AS ok FROM ledger.batches) b "
            "WHERE pipeline = :p"), {"p": pipeline.name}).one()
        assert totals.unfinished == 0
        assert (totals.r, totals.w, totals.q) == (len(good) + len(bad), len(good), len(bad))
        staging = conn.execute(text(
            "SELECT count(*) FROM information_schema.tables t JOIN ledger.batches b "
            "ON t.table_name LIKE 'b' || b.batch_id || '\\_a%' WHERE t.table_schema = 'ledger_staging' AND b.pipeline = :p"),
            {"p": pipeline.name}).scalar_one()
        assert staging == 0, "staging tables left behind"
    from ledgerbatch.ops.verify import verify

    assert verify(engine, pipeline.spec) == []


def cli(args: list[str], db_url: str, bootstrap: str | None, pipelines_dir: Path, timeout: float = 300, **env) -> subprocess.CompletedProcess:
    """Run `ledgerbatch ...` in its own process group, as a user would."""
    full_env = {**os.environ, "LEDGERBATCH_DB_URL": db_url, "LEDGERBATCH_PIPELINES_DIR": str(pipelines_dir),
                "LEDGERBATCH_SPARK_MASTER": "local[2]", **env}
    if bootstrap:
        full_env["KAFKA_BOOTSTRAP_SERVERS"] = bootstrap
    else:
        full_env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    proc = subprocess.Popen([sys.executable, "-m", "ledgerbatch.cli", *args], env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=REPO)
    out, err = proc.communicate(timeout=timeout)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    done.pgid = proc.pid  # its own process group: Spark's JVM and Python workers are in it too
    return done


def committed_offsets(engine, pipeline: str) -> int:
    """Offsets the pipeline's cursors have moved past its start, in all."""
    with engine.connect() as conn:
        return conn.execute(text("SELECT coalesce(sum(next_offset - start_offset), 0) FROM ledger.cursors "
                                 "WHERE pipeline = :p"), {"p": pipeline}).scalar_one()


def wait_committed(engine, pipeline: str, offsets: int, process, timeout_s: float = 180) -> float:
    """Wait until `offsets` are committed while `process` (a follower or service) runs; the seconds it took."""
    started = time.monotonic()
    while committed_offsets(engine, pipeline) < offsets:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() - started < timeout_s, f"{pipeline}: {offsets} offsets not committed in {timeout_s}s"
        time.sleep(0.05)
    return time.monotonic() - started

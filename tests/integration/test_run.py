"""End to end on real parts: Apache Kafka, PostgreSQL, local Spark."""
from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from ledgerbatch.ledger.batches import begin_attempt, get_batch
from ledgerbatch.ledger.cursors import get_cursors, init_cursors
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.errors import BatchFailedError, DataLossError, FencedError, LedgerbatchError, ReconcileError
from ledgerbatch.plan.live import plan_next
from ledgerbatch.stage.process import process_batch
from ledgerbatch.ops.run import run_pipeline
from ledgerbatch.sqlfiles import query

from .helpers import assert_exactly_once, delete_records, end_offsets, order_value, produce

pytestmark = pytest.mark.integration


def run(engine, db_url, broker, spark, pipeline, **kw):
    return run_pipeline(engine, pipeline.spec, db_url, broker.bootstrap_servers, lambda: spark, **kw)


def test_several_partitions_and_batches(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=4, batch__max_records=700)
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 4, order_value(i)) for i in range(2000)])
    summary = run(engine, db_url, broker, spark, p)
    assert summary.batches == 3  # 2000 offsets, at most 700 per batch
    assert summary.records_read == 2000
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())

    # New data continues from the cursors; nothing new plans nothing.
    more = produce(broker.bootstrap_servers, p.topic, [(i % 4, order_value(i)) for i in range(2000, 2100)])
    assert run(engine, db_url, broker, spark, p).batches == 1
    assert run(engine, db_url, broker, spark, p).batches == 0
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked + more}, set())
    with engine.connect() as conn:
        amounts = conn.execute(text(f'SELECT sum(amount) FROM public."{p.table}"')).scalar_one()
    assert str(amounts) == "2100.00"


def test_second_commit_is_a_noop(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=2)
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(100)])
    summary = run(engine, db_url, broker, spark, p)
    again = commit_batch(engine, p.spec, summary.batch_ids[0])
    assert again.already_committed and again.rows_written == 100
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())


def test_stale_attempt_is_fenced(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=2)
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(50)])
    batch = plan_next(engine, p.spec, broker.bootstrap_servers)
    first = process_batch(spark, engine, p.spec, batch.batch_id, db_url, broker.bootstrap_servers)
    again = process_batch(spark, engine, p.spec, batch.batch_id, db_url, broker.bootstrap_servers)
    assert (first.attempt, again.attempt, again.status) == (1, 1, "staged")  # staged work is never re-read

    # A newer attempt takes over while attempt 1 is staged: attempt 1 can no longer commit.
    with engine.begin() as conn:
        assert begin_attempt(conn, batch.batch_id) == 2
    with pytest.raises(LedgerbatchError, match="not staged"):
        commit_batch(engine, p.spec, batch.batch_id, attempt=1)
    third = process_batch(spark, engine, p.spec, batch.batch_id, db_url, broker.bootstrap_servers)
    assert third.attempt == 3
    with pytest.raises(FencedError, match="attempt 1 is stale"):
        commit_batch(engine, p.spec, batch.batch_id, attempt=1)

    # A cursor moved by someone else fences the commit and changes nothing.
    with engine.begin() as conn:
        conn.execute(text("UPDATE ledger.cursors SET next_offset = next_offset + 1, last_batch_id = :b "
                          "WHERE pipeline = :p AND partition = 0"), {"b": batch.batch_id, "p": p.name})
    with pytest.raises(FencedError, match="fenced"):
        commit_batch(engine, p.spec, batch.batch_id, attempt=third.attempt)
    with engine.connect() as conn:
        assert get_batch(conn, batch.batch_id).status == "staged"
        assert conn.execute(text(f"SELECT to_regclass('public.\"{p.table}\"')")).scalar_one() is None
    with engine.begin() as conn:
        conn.execute(text("UPDATE ledger.cursors SET next_offset = next_offset - 1, last_batch_id = NULL "
                          "WHERE pipeline = :p AND partition = 0"), {"p": p.name})
    commit_batch(engine, p.spec, batch.batch_id, attempt=third.attempt)
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())


POISON = {
    b"\xff\xfe\x00": "not valid UTF-8",
    b"{\"order_id\": ": "not valid JSON",
    b"[1,2]": "JSON list, not an object",
    b"\"just a string\"": "JSON str, not an object",
    b"": "empty value",
    None: "tombstone",
    b"{\"order_id\": \"x\", \"amount\": \"ten\"}": "field amount",
    b"{\"order_id\": \"x\", \"amount\": 1e40}": "does not fit DECIMAL(12,2)",
    b"{\"order_id\": \"x\", \"ts\": 1700000000}": "field ts: expected an ISO-8601 timestamp",
    b"{\"order_id\": [1]}": "field order_id: expected a string",
    b"{\"order_id\": \"a\\u0000b\"}": "NUL character",
    b"{\"amount\": NaN}": "NaN is not a JSON number",
    b"[" * 50_000 + b"]" * 50_000: "nested too deeply",
}


def test_each_poison_class_is_quarantined(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1, errors__max_ratio=1.0)
    records = [(0, order_value(0))] + [(0, v) for v in POISON] + [(0, order_value(1))]
    acked = produce(broker.bootstrap_servers, p.topic, records)
    run(engine, db_url, broker, spark, p)
    good = {(a[0], a[1]) for a in (acked[0], acked[-1])}
    bad = {(a[0], a[1]) for a in acked[1:-1]}
    assert_exactly_once(engine, p, broker.bootstrap_servers, good, bad)
    with engine.connect() as conn:
        rows = conn.execute(text('SELECT "offset", key, value, error FROM ledger.quarantine WHERE pipeline = :p ORDER BY "offset"'),
                            {"p": p.name}).all()
    for (partition, offset, value), row, expected_reason in zip(acked[1:-1], rows, POISON.values()):
        assert row.offset == offset
        assert (bytes(row.value) if row.value is not None else None) == value  # raw bytes kept exactly
        assert row.key is not None
        assert expected_reason in row.error, (value[:40] if value else value, row.error)


def test_min_bad_lets_a_trickle_end_on_poison(engine, db_url, broker, spark, make_pipeline):
    """12 poison records after 6,000 good ones make a batch of their own (100% bad): above the ratio, but not
    above errors.min_bad, so they are quarantined and the pipeline goes on; without the floor it stops."""
    records = [(0, order_value(i)) for i in range(6000)] + [(0, b"poison %d" % i) for i in range(12)]
    floored = make_pipeline(partitions=1, batch__max_records=6000, errors={"max_ratio": 0.5, "min_bad": 100})
    acked = produce(broker.bootstrap_servers, floored.topic, records)
    assert run(engine, db_url, broker, spark, floored).batches == 2
    assert_exactly_once(engine, floored, broker.bootstrap_servers, {(a[0], a[1]) for a in acked[:6000]},
                        {(a[0], a[1]) for a in acked[6000:]})
    strict = make_pipeline(partitions=1, batch__max_records=6000, errors={"max_ratio": 0.5})
    produce(broker.bootstrap_servers, strict.topic, records)
    with pytest.raises(BatchFailedError, match=r"12 of 12 records are bad \(100.0%\), more than errors.max_ratio 50.0%"):
        run(engine, db_url, broker, spark, strict)


def test_policy_fail_and_max_ratio_fail_the_batch(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1, errors={"policy": "fail"})
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(0)), (0, b"oops")])
    with pytest.raises(BatchFailedError, match="errors.policy is fail"):
        run(engine, db_url, broker, spark, p)
    p2 = make_pipeline(partitions=1, errors={"policy": "quarantine", "max_ratio": 0.2})
    produce(broker.bootstrap_servers, p2.topic, [(0, order_value(i)) for i in range(3)] + [(0, b"x")])
    with pytest.raises(BatchFailedError, match="more than errors.max_ratio"):
        run(engine, db_url, broker, spark, p2)
    with engine.connect() as conn:
        for pipeline in (p, p2):
            batch = conn.execute(text("SELECT status, error FROM ledger.batches WHERE pipeline = :p"), {"p": pipeline.name}).one()
            assert batch.status == "failed" and batch.error
            assert conn.execute(text("SELECT count(*) FROM ledger.cursors WHERE pipeline = :p AND last_batch_id IS NOT NULL"),
                                {"p": pipeline.name}).scalar_one() == 0
            assert conn.execute(text(f"SELECT to_regclass('public.\"{pipeline.table}\"')")).scalar_one() is None


def test_out_of_range_start_fails_with_ledger_unchanged(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1)
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(10)])
    batch = plan_next(engine, p.spec, broker.bootstrap_servers)
    assert batch.ranges[0].from_offset == 0
    delete_records(broker.bootstrap_servers, p.topic, 0, 5)  # offset 0 leaves the log, as retention would
    assert end_offsets(broker.bootstrap_servers, p.topic, 1)[0] == (5, 10)

    with pytest.raises(DataLossError, match="no longer in Kafka.*Offset out of range.*acknowledge-loss"):
        process_batch(spark, engine, p.spec, batch.batch_id, db_url, broker.bootstrap_servers)
    with engine.connect() as conn:
        b = get_batch(conn, batch.batch_id)
        assert b.status == "failed" and b.ranges == batch.ranges
        assert get_cursors(conn, p.name) == {(p.topic, 0): 0}
        assert conn.execute(text(f"SELECT to_regclass('public.\"{p.table}\"')")).scalar_one() is None
        assert conn.execute(text("SELECT count(*) FROM ledger.quarantine WHERE pipeline = :p"), {"p": p.name}).scalar_one() == 0


def test_cursor_before_log_start_refuses_to_plan(engine, broker, make_pipeline):
    p = make_pipeline(partitions=1)
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(3)])
    with engine.begin() as conn:
        init_cursors(conn, p.name, {(p.topic, 0): 0})
    delete_records(broker.bootstrap_servers, p.topic, 0, 2)
    with pytest.raises(DataLossError, match="before the log start"):
        plan_next(engine, p.spec, broker.bootstrap_servers)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ledger.batches WHERE pipeline = :p"), {"p": p.name}).scalar_one() == 0
        assert get_cursors(conn, p.name) == {(p.topic, 0): 0}


def test_ranges_ending_on_transaction_markers_terminate(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=2)
    acked = []
    for t in range(3):
        acked += produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(t * 100 + i)) for i in range(10)],
                         transactional_id=f"tx-{p.name}")
    ends = end_offsets(broker.bootstrap_servers, p.topic, 2)
    assert all(hi == 5 * 3 + 3 for _, hi in ends.values()), ends  # 5 records + 1 commit marker per transaction
    started = time.monotonic()
    summary = run(engine, db_url, broker, spark, p)
    assert time.monotonic() - started < 60
    assert summary.records_read == 30
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())


def test_upsert_keeps_the_latest_value(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1, target={"table": "", "mode": "upsert", "key": ["order_id"]}, batch__max_records=4)
    (p.dir / f"{p.name}.yaml").write_text((p.dir / f"{p.name}.yaml").read_text().replace("table: ''", f"table: public.{p.table}"))
    values = [order_value(i % 3, amount=f"{i}.00") for i in range(10)]  # keys o-0, o-1, o-2, updated repeatedly
    produce(broker.bootstrap_servers, p.topic, [(0, v) for v in values] + [(0, b'{"customer": "no key"}')])
    summary = run(engine, db_url, broker, spark, p)
    assert summary.batches == 3
    with engine.connect() as conn:
        rows = dict(conn.execute(text(f'SELECT order_id, amount FROM public."{p.table}" ORDER BY order_id')).all())
        reason = conn.execute(text("SELECT error FROM ledger.quarantine WHERE pipeline = :p"), {"p": p.name}).scalar_one()
    assert {k: str(v) for k, v in rows.items()} == {"o-0": "9.00", "o-1": "7.00", "o-2": "8.00"}
    assert "part of the target key" in reason


def test_target_table_that_disagrees_with_the_spec_is_refused(engine, db_url, broker, spark, make_pipeline):
    from ledgerbatch.errors import SpecError

    p = make_pipeline(partitions=1)
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(5)])
    with engine.begin() as conn:
        conn.execute(text(f'CREATE TABLE public."{p.table}" (order_id integer, customer text)'))
    with pytest.raises(SpecError, match="disagrees with the spec: order_id is integer, the spec says text; amount is missing"):
        run(engine, db_url, broker, spark, p)
    with engine.connect() as conn:
        assert get_batch(conn, conn.execute(text(
            "SELECT batch_id FROM ledger.batches WHERE pipeline = :p"), {"p": p.name}).scalar_one()).status == "staged"
        assert get_cursors(conn, p.name) == {(p.topic, 0): 0}
        assert conn.execute(text(f'SELECT count(*) FROM public."{p.table}"')).scalar_one() == 0


def test_brokers_down_mid_read(engine, db_url, mock_broker, spark, tmp_path):
    """On the mock cluster: it takes every broker down and up on demand, to the moment (a real broker's restart
    waits out its ZooKeeper session; test_real_kafka.py kills a real leader)."""
    import threading

    from ..conftest import Pipeline

    broker = mock_broker
    p = Pipeline(tmp_path / "pipelines", broker, 2)
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(200)])
    batch = plan_next(engine, p.spec, broker.bootstrap_servers)
    brokers = range(1, broker.brokers + 1)

    # Down for longer than the stall timeout: the batch fails loudly, nothing is committed.
    for b in brokers:
        broker.broker_down(b)
    try:
        with pytest.raises(BatchFailedError, match="no progress for 3s"):
            process_batch(spark, engine, p.spec, batch.batch_id, db_url, broker.bootstrap_servers, stall_timeout_s=3)
    finally:
        for b in brokers:
            broker.broker_up(b)
    with engine.connect() as conn:
        assert get_batch(conn, batch.batch_id).status == "failed"
        assert get_cursors(conn, p.name) == {(p.topic, 0): 0, (p.topic, 1): 0}

    # Down for a moment while the attempt reads: the consumer reconnects and the batch completes.
    for b in brokers:
        broker.broker_down(b)
    threading.Timer(4, lambda: [broker.broker_up(b) for b in brokers]).start()
    staged = process_batch(spark, engine, p.spec, batch.batch_id, db_url, broker.bootstrap_servers, stall_timeout_s=60)
    assert staged.status == "staged" and staged.records_read == 200
    commit_batch(engine, p.spec, batch.batch_id)
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())


def test_append_target_gains_partitions_for_big_batches_only(engine, db_url, broker, spark, make_pipeline, monkeypatch):
    monkeypatch.setattr("ledgerbatch.commit.modes.partitions.ATTACH_MIN_ROWS", 30)
    p = make_pipeline(partitions=2, batch__max_records=40)
    # 40 (big: the first, open partition), 40 (big: closes it), 20 (small: copied into the open one)
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(100)])
    assert run(engine, db_url, broker, spark, p).batches == 3
    acked += produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(100, 110)])
    assert run(engine, db_url, broker, spark, p).batches == 1  # small: copied
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())
    with engine.connect() as conn:
        batches = conn.execute(text("SELECT batch_id FROM ledger.batches WHERE pipeline = :p ORDER BY 1"),
                               {"p": p.name}).scalars().all()
        bounds = conn.execute(text(
            "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(:t) ORDER BY c.oid"), {"t": f'public."{p.table}"'}).scalars().all()
        per_partition = conn.execute(text(f'SELECT tableoid, count(*) FROM public."{p.table}" GROUP BY 1 ORDER BY min(_batch_id)')).all()
    first, second = batches[0], batches[1]
    assert bounds == [f"FOR VALUES FROM ('{first}') TO ('{second}')", f"FOR VALUES FROM ('{second}') TO (MAXVALUE)"]
    assert [n for _, n in per_partition] == [40, 70]  # the open partition holds batch 2 and the two small ones


def test_batch_staged_by_an_earlier_version_is_staged_again(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=2)
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i)) for i in range(20)])
    batch = plan_next(engine, p.spec, broker.bootstrap_servers)
    with engine.begin() as conn:  # the earlier shape: one unlogged table, bad records flagged by _error
        attempt = begin_attempt(conn, batch.batch_id)
        staging = f"b{batch.batch_id}_a{attempt}"
        conn.execute(text(f'CREATE UNLOGGED TABLE ledger_staging."{staging}" '
                          "(order_id text, _topic text, _partition int, _offset bigint, _error text)"))
        conn.execute(text(query("mark_staged")), {"batch_id": batch.batch_id, "attempt": attempt, "staging_table": staging,
                                                  "records_read": 20, "rows_written": 20, "rows_quarantined": 0,
                                                  "records_filtered": 0, "groups_written": None})
    with pytest.raises(ReconcileError, match="earlier ledgerbatch"):
        commit_batch(engine, p.spec, batch.batch_id)
    assert run(engine, db_url, broker, spark, p).batches == 1
    assert_exactly_once(engine, p, broker.bootstrap_servers, {(a[0], a[1]) for a in acked}, set())

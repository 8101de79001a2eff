"""Bounded history on real parts (Apache Kafka, PostgreSQL, local Spark): partitions rolled up, the ledger
compacted into checkpoints, quarantine purged, and `verify`, replays and `status` still answering."""
from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from ledgerbatch.commit.modes.append import partitions_of
from ledgerbatch.commit.modes.rollup import roll_up
from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.ops.history import compact, purge_quarantine, upkeep
from ledgerbatch.ops.run import run_pipeline, run_replay
from ledgerbatch.ops.status import pipeline_status, render
from ledgerbatch.ops.verify import verify
from ledgerbatch.plan.replay import ReplayRequest
from ledgerbatch.stage.tables import drop_finished_staging

from .helpers import cli, produce

pytestmark = pytest.mark.integration

LATER = timedelta(minutes=1)


def run(engine, db_url, broker, spark, p, **kw):
    return run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark, **kw)


def replay(engine, db_url, broker, spark, p, partition, start, until):
    return run_replay(engine, p.spec, ReplayRequest(p.topic, (partition,), start, until), db_url,
                      broker.bootstrap_servers, lambda: spark, dry_run=False)


def order(i: int, amount: str = "1.00") -> bytes:
    return json.dumps({"order_id": f"o-{i}", "customer": f"c-{i % 3}", "amount": amount,
                       "ts": "2026-11-21T10:00:00Z"}).encode()


def ledger_rows(engine, p) -> dict:
    with engine.connect() as conn:
        return dict(conn.execute(text(
            "SELECT 'batches', count(*) FROM ledger.batches WHERE pipeline = :p UNION ALL "
            "SELECT 'ranges', count(*) FROM ledger.batch_ranges WHERE pipeline = :p UNION ALL "
            "SELECT 'checkpoints', count(*) FROM ledger.checkpoints WHERE pipeline = :p UNION ALL "
            "SELECT 'quarantine', count(*) FROM ledger.quarantine WHERE pipeline = :p"), {"p": p.name}).all())


def target(engine, p, columns="_partition, _offset"):
    with engine.connect() as conn:
        return sorted(tuple(r) for r in conn.execute(text(f'SELECT {columns} FROM public."{p.table}"')))


def test_append_history_stays_bounded_and_verify_still_proves_it(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=2, batch__max_records=20, target__partitions={"max": 4, "attach_min_rows": 1})
    bad = {7, 45}  # record indexes that are not JSON: quarantined
    acked = produce(broker.bootstrap_servers, p.topic,
                    [(i % 2, b"not json" if i in bad else order(i)) for i in range(200)])
    summary = run(engine, db_url, broker, spark, p)  # every batch attached as a partition, then rolled up
    assert summary.batches == 10
    with engine.connect() as conn:
        bounds = sorted((q.lower, q.upper) for q in partitions_of(conn, p.spec))
    assert len(bounds) == 4 and bounds[-1] == (summary.batch_ids[-1], None)
    assert bounds[0][0] == summary.batch_ids[0]
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # still one run of batch ids, no gap
    before = ledger_rows(engine, p)
    done = upkeep(engine, p.spec)  # the spec asks for no compaction, and the bound holds
    assert (done.compacted, done.purged, done.rollups) == (None, None, ())

    result = compact(engine, p.spec, datetime.now(timezone.utc) + LATER)
    assert (result.batches, result.horizon) == (10, False)
    assert ledger_rows(engine, p) == {"batches": 0, "ranges": 0, "checkpoints": 2, "quarantine": 2}
    assert before["ranges"] == 20
    assert verify(engine, p.spec) == []
    good = sorted((a[0], a[1]) for a in acked if a[2] != b"not json")
    assert target(engine, p) == good

    # A replay of compacted offsets finds and replaces their rows, wherever the rollup put them.
    replay(engine, db_url, broker, spark, p, 1, 0, 40)
    assert target(engine, p) == good
    assert verify(engine, p.spec) == []

    # New batches go on from the checkpoint; compacting again extends it; status still answers.
    produce(broker.bootstrap_servers, p.topic, [(i % 2, order(i)) for i in range(200, 240)])
    assert run(engine, db_url, broker, spark, p).batches == 2
    assert compact(engine, p.spec, datetime.now(timezone.utc) + LATER).batches == 3  # two live, one replay
    with engine.connect() as conn:
        checkpoints = conn.execute(text("SELECT partition, from_offset, until_offset, records_read FROM "
                                        "ledger.checkpoints WHERE pipeline = :p ORDER BY 1"), {"p": p.name}).all()
    assert [tuple(c) for c in checkpoints] == [(0, 0, 120, 120), (1, 0, 120, 120)]
    assert verify(engine, p.spec) == []
    status = pipeline_status(engine, p.name, p.spec.topics, broker.bootstrap_servers)
    assert status["history"]["batches_compacted"] == 13 and status["total_lag"] == 0
    assert "history: 13 batches compacted" in render(status)


def test_verify_still_catches_what_compaction_hides_nothing_of(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1, batch__max_records=10)
    produce(broker.bootstrap_servers, p.topic, [(0, order(i)) for i in range(30)])
    run(engine, db_url, broker, spark, p)
    compact(engine, p.spec, datetime.now(timezone.utc) + LATER)
    with engine.begin() as conn:
        conn.execute(text(f'DELETE FROM public."{p.table}" WHERE _offset = 4'))
        conn.execute(text("UPDATE ledger.checkpoints SET until_offset = 29, records_read = 29 WHERE pipeline = :p"),
                     {"p": p.name})
    problems = verify(engine, p.spec)
    assert any("cursor at 30 but committed ranges end at 29" in x for x in problems), problems
    assert any("target holds 29 rows" in x for x in problems), problems


def test_only_batches_finished_before_the_time_fold_and_an_open_one_stops_the_fold(engine, db_url, broker, spark,
                                                                                    make_pipeline):
    from ledgerbatch.plan.live import plan_next

    p = make_pipeline(partitions=1, batch__max_records=10)
    produce(broker.bootstrap_servers, p.topic, [(0, order(i)) for i in range(20)])
    run(engine, db_url, broker, spark, p)
    assert compact(engine, p.spec, datetime.now(timezone.utc) - timedelta(hours=1)).batches == 0
    produce(broker.bootstrap_servers, p.topic, [(0, order(i)) for i in range(20, 25)])
    open_batch = plan_next(engine, p.spec, broker.bootstrap_servers)  # planned, not staged
    done = compact(engine, p.spec, datetime.now(timezone.utc) + LATER)
    assert done.batches == 2 and done.through < open_batch.batch_id
    assert run(engine, db_url, broker, spark, p).batches == 1  # the open batch resumes and commits
    assert verify(engine, p.spec) == []
    assert len(target(engine, p)) == 25


def test_change_pipeline_forgets_deletes_behind_a_replay_horizon(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1, batch__max_records=4, target__mode="upsert", target__key=["order_id"],
                      target__deletes=True)
    keys = [json.dumps({"order_id": f"o-{i % 3}"}).encode() for i in range(8)]
    values = [order(i % 3, str(i)) for i in range(8)]
    values[5] = None  # a tombstone deletes o-2
    produce(broker.bootstrap_servers, p.topic, [(0, v) for v in values], keys=keys)
    run(engine, db_url, broker, spark, p)
    rows = target(engine, p, "order_id, amount::text")
    assert rows == [("o-0", "6.00"), ("o-1", "7.00")]

    done = compact(engine, p.spec, datetime.now(timezone.utc) + LATER)
    assert (done.batches, done.deletes, done.horizon) == (2, 1, True)
    assert verify(engine, p.spec) == []
    with pytest.raises(LedgerbatchError, match=r"the replay horizon is 8: replay from 8 on"):
        replay(engine, db_url, broker, spark, p, 0, 0, 8)

    produce(broker.bootstrap_servers, p.topic, [(0, order(2, "9.00"))], keys=[b'{"order_id": "o-2"}'])
    run(engine, db_url, broker, spark, p)
    replay(engine, db_url, broker, spark, p, 0, 8, 9)  # after the horizon: still a replay
    assert target(engine, p, "order_id, amount::text") == [("o-0", "6.00"), ("o-1", "7.00"), ("o-2", "9.00")]
    assert verify(engine, p.spec) == []


def test_aggregate_folds_contributions_and_its_totals_stay_exact(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1, batch__max_records=5, target__mode="aggregate", target__key=["customer"],
                      target__measures={"orders": "sum", "revenue": "sum", "largest": "max"},
                      transform="SELECT customer, count(*) AS orders, sum(amount) AS revenue, max(amount) AS largest "
                                "FROM batch GROUP BY customer")
    produce(broker.bootstrap_servers, p.topic, [(0, order(i, f"{i}.00")) for i in range(15)])
    run(engine, db_url, broker, spark, p)
    with engine.connect() as conn:
        contributions = lambda: conn.execute(text(f'SELECT count(*) FROM ledger_aggregates."{p.name}"')).scalar_one()  # noqa: E731
        assert contributions() == 9  # 3 batches x 3 customers
        done = compact(engine, p.spec, datetime.now(timezone.utc) + LATER)
        conn.commit()
        assert (done.batches, done.horizon) == (3, True) and contributions() == 3
    assert verify(engine, p.spec) == []
    produce(broker.bootstrap_servers, p.topic, [(0, order(i, f"{i}.00")) for i in range(15, 18)])
    run(engine, db_url, broker, spark, p)
    assert target(engine, p, "customer, orders, revenue::text, largest::text") == [
        ("c-0", 6, "45.00", "15.00"), ("c-1", 6, "51.00", "16.00"), ("c-2", 6, "57.00", "17.00")]
    assert verify(engine, p.spec) == []
    with pytest.raises(LedgerbatchError, match="replay horizon is 15"):
        replay(engine, db_url, broker, spark, p, 0, 5, 10)


def test_quarantine_purge_keeps_the_counts_and_a_replay_quarantines_again(engine, db_url, broker, spark,
                                                                          make_pipeline):
    p = make_pipeline(partitions=1, batch__max_records=10)
    produce(broker.bootstrap_servers, p.topic, [(0, b"oops" if i % 5 == 0 else order(i)) for i in range(20)])
    run(engine, db_url, broker, spark, p)
    assert ledger_rows(engine, p)["quarantine"] == 4
    assert purge_quarantine(engine, p.spec, datetime.now(timezone.utc) - timedelta(hours=1)) == 0
    assert purge_quarantine(engine, p.spec, datetime.now(timezone.utc) + LATER) == 4
    assert ledger_rows(engine, p)["quarantine"] == 0
    assert verify(engine, p.spec) == []
    replay(engine, db_url, broker, spark, p, 0, 0, 10)  # its two bad records are quarantined again
    assert ledger_rows(engine, p)["quarantine"] == 2
    assert verify(engine, p.spec) == []


def test_the_cli_compacts_and_purges_by_age_and_explains_bad_input(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1, batch__max_records=10)
    produce(broker.bootstrap_servers, p.topic, [(0, b"x" if i == 3 else order(i)) for i in range(20)])
    run(engine, db_url, broker, spark, p)
    with engine.begin() as conn:  # two days old
        conn.execute(text("UPDATE ledger.batches SET committed_at = committed_at - interval '2 days', "
                          "updated_at = updated_at - interval '2 days' WHERE pipeline = :p"), {"p": p.name})
        conn.execute(text("UPDATE ledger.quarantine SET quarantined_at = quarantined_at - interval '2 days' "
                          "WHERE pipeline = :p"), {"p": p.name})
    out = cli(["compact", p.name, "--before", "1d"], db_url, broker.bootstrap_servers, p.dir)
    assert out.returncode == 0, out.stderr
    assert "2 batches compacted" in out.stdout
    out = cli(["quarantine", "purge", p.name, "--before", "1d"], db_url, broker.bootstrap_servers, p.dir)
    assert out.returncode == 0 and "1 quarantined records older than" in out.stdout, out.stderr
    out = cli(["compact", p.name, "--before", "last week"], db_url, broker.bootstrap_servers, p.dir)
    assert out.returncode == 1 and "neither an ISO-8601 time nor an age such as 30d" in out.stderr
    out = cli(["verify", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert out.returncode == 0 and "all invariants hold" in out.stdout, out.stdout + out.stderr


def test_a_run_compacts_and_purges_as_its_spec_asks(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1, batch__max_records=10, history={"compact_after": "1s"},
                      errors__quarantine_retention="1s")
    produce(broker.bootstrap_servers, p.topic, [(0, b"x" if i == 3 else order(i)) for i in range(30)])
    run(engine, db_url, broker, spark, p)
    time.sleep(1.2)
    run(engine, db_url, broker, spark, p)  # its upkeep at the start folds the three batches
    assert ledger_rows(engine, p) == {"batches": 0, "ranges": 0, "checkpoints": 1, "quarantine": 0}
    assert verify(engine, p.spec) == []


def test_compaction_drops_staging_tables_a_crash_left(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1, batch__max_records=10)
    produce(broker.bootstrap_servers, p.topic, [(0, order(i)) for i in range(10)])
    batch_id = run(engine, db_url, broker, spark, p).batch_ids[0]
    with engine.begin() as conn:  # what a crash between COMMIT and the clean-up leaves
        conn.execute(text(f"CREATE TABLE ledger_staging.b{batch_id}_a9 (x int)"))
        conn.execute(text(f"CREATE TABLE ledger_staging.b{batch_id}_a9_bad (x int)"))
    compact(engine, p.spec, datetime.now(timezone.utc) + LATER)
    with engine.begin() as conn:  # one a stalled attempt kept locked through the compaction: its batch is gone
        conn.execute(text(f"CREATE TABLE ledger_staging.b{batch_id}_a8 (x int)"))
    assert drop_finished_staging(engine, p.name) == []
    with engine.connect() as conn:
        left = conn.execute(text("SELECT count(*) FROM pg_tables WHERE schemaname = 'ledger_staging' "
                                 "AND tablename LIKE :name"), {"name": f"b{batch_id}\\_%"}).scalar_one()
    assert left == 0
    assert verify(engine, p.spec) == []


def test_a_rollup_gives_way_to_a_long_query_and_merges_later(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=1, batch__max_records=10, target__partitions={"max": 8, "attach_min_rows": 1})
    produce(broker.bootstrap_servers, p.topic, [(0, order(i)) for i in range(30)])
    run(engine, db_url, broker, spark, p)
    tighter = replace(p.spec, max_partitions=2)  # the bound lowered after three partitions were made
    reader = engine.connect()
    reader.execute(text(f'SELECT count(*) FROM public."{p.table}"'))  # holds the target until it ends
    try:
        assert roll_up(engine, tighter) is None
    finally:
        reader.rollback()
        reader.close()
    assert roll_up(engine, tighter) is not None
    with engine.connect() as conn:
        assert len(partitions_of(conn, p.spec)) == 2
    assert len(target(engine, p)) == 30 and verify(engine, p.spec) == []


def test_rollups_keep_the_targets_own_rules(engine, db_url, broker, spark, make_pipeline):
    """A target with an identity, a generated column, a DEFAULT, a CHECK and an auditing trigger: rolled up,
    its rows keep their values, the trigger saw each row once, and it goes on working on the merged partition."""
    p = make_pipeline(partitions=1, batch__max_records=10, target__partitions={"max": 2, "attach_min_rows": 1})
    t = f'public."{p.table}"'
    with engine.begin() as conn:
        conn.execute(text(f"""
            CREATE TABLE {t} (order_id text, customer text, amount numeric(12,2), ts timestamptz,
                _topic text NOT NULL, _partition integer NOT NULL, _offset bigint NOT NULL, _batch_id bigint NOT NULL,
                id bigint GENERATED ALWAYS AS IDENTITY, doubled numeric GENERATED ALWAYS AS (amount * 2) STORED,
                channel text NOT NULL DEFAULT 'web', CHECK (amount >= 0),
                UNIQUE (_topic, _partition, _offset, _batch_id)) PARTITION BY RANGE (_batch_id);
            CREATE TABLE public."{p.table}_audit" (order_id text);
            CREATE FUNCTION public."{p.table}_audited"() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN INSERT INTO public."{p.table}_audit" VALUES (NEW.order_id); RETURN NEW; END $$;
            CREATE TRIGGER audited AFTER INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION public."{p.table}_audited"();"""))
    produce(broker.bootstrap_servers, p.topic, [(0, order(i, f"{i}.00")) for i in range(30)])
    run(engine, db_url, broker, spark, p)
    produce(broker.bootstrap_servers, p.topic, [(0, order(i, f"{i}.00")) for i in range(30, 40)])
    run(engine, db_url, broker, spark, p)  # into a merged partition's neighbour, then merged again
    with engine.connect() as conn:
        assert len(partitions_of(conn, p.spec)) == 2
        rows = conn.execute(text(f"SELECT count(*), count(DISTINCT id), bool_and(doubled = amount * 2), "
                                 f"bool_and(channel = 'web') FROM {t}")).one()
        audited = conn.execute(text(f'SELECT count(*), count(DISTINCT order_id) FROM public."{p.table}_audit"')).one()
    assert tuple(rows) == (40, 40, True, True)
    assert tuple(audited) == (40, 40)  # the merges copied rows without firing the trigger again
    assert verify(engine, p.spec) == []

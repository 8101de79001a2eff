"""Query transforms and aggregate targets on real parts (Apache Kafka, local Spark, PostgreSQL): totals
equal totals computed independently from the produced records, after kills, replays and backfills."""
from __future__ import annotations

import os
import random
import signal
import time
from collections import defaultdict
from decimal import Decimal

import pytest
import yaml
from sqlalchemy import text

from ledgerbatch.ledger.batches import delivering_batches
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.errors import BatchFailedError, SpecError
from ledgerbatch.stage.process import process_batch
from ledgerbatch.stage.transform import batch_shape
from ledgerbatch.model.ranges import OffsetRange
from ledgerbatch.plan.replay import ReplayRequest, plan_replay, resolve_ranges
from ledgerbatch.commit.diff import dry_run_diff
from ledgerbatch.ops.run import run_pipeline
from ledgerbatch.ops.verify import verify

from .helpers import cli, produce
from .test_faults import EXPECTED_AFTER_CRASH, _popen_run, first_batch

pytestmark = pytest.mark.integration

PER_MINUTE = """
SELECT customer, date_trunc('minute', ts) AS minute, count(*) AS orders, sum(amount) AS revenue,
       min(amount) AS smallest, max(amount) AS largest
FROM batch WHERE amount > 0 GROUP BY customer, date_trunc('minute', ts)
"""
AGGREGATE = dict(transform=PER_MINUTE, target__mode="aggregate", target__key=["customer", "minute"],
                 target__measures={"orders": "sum", "revenue": "sum", "smallest": "min", "largest": "max"})
# The same groups with the sum narrowed to DECIMAL(18,2): every output column then has a binary COPY
# encoder (stage/binary_copy.py), where sum's DECIMAL(22,2) takes the CSV COPY.
NARROW_SUM = PER_MINUTE.replace("sum(amount) AS", "CAST(sum(amount) AS DECIMAL(18,2)) AS")


def order(i: int, amount: str, minute: int, customer: int) -> bytes:
    return (f'{{"order_id":"o-{i}","customer":"c-{customer}","amount":"{amount}",'
            f'"ts":"2026-11-21T10:{minute:02d}:{i % 60:02d}Z"}}').encode()


def produce_orders(broker, p, n: int, seed: int, start: int = 0) -> list[tuple[int, bytes]]:
    """n orders over 3 customers x 4 minutes in p.partitions partitions; every 50th is bad JSON and
    every 7th has a non-positive amount (filtered by the query)."""
    rnd = random.Random(seed)
    records = []
    for i in range(start, start + n):
        amount = f"{rnd.randint(-300, 5000) / 100:.2f}" if i % 7 == 0 else f"{rnd.randint(1, 5000) / 100:.2f}"
        value = b"{not json" if i % 50 == 49 else order(i, amount, rnd.randrange(4), rnd.randrange(3))
        records.append((rnd.randrange(p.partitions), value))
    produce(broker.bootstrap_servers, p.topic, records)
    return records


def expected_totals(records: list[tuple[int, bytes]]) -> dict:
    """The per-minute groups, computed from the produced values alone (not through ledgerbatch)."""
    import json

    groups = defaultdict(lambda: [0, Decimal(0), None, None])
    for _, value in records:
        try:
            o = json.loads(value)
        except ValueError:
            continue
        amount = Decimal(o["amount"])
        if amount <= 0:
            continue
        g = groups[(o["customer"], o["ts"][:16])]
        g[0] += 1
        g[1] += amount
        g[2] = amount if g[2] is None else min(g[2], amount)
        g[3] = amount if g[3] is None else max(g[3], amount)
    return {k: tuple(v) for k, v in groups.items()}


def totals(engine, p) -> dict:
    with engine.connect() as conn:
        rows = conn.execute(text(f'SELECT customer, minute, orders, revenue, smallest, largest FROM public."{p.table}"'))
        return {(r.customer, r.minute.strftime("%Y-%m-%dT%H:%M")): (r.orders, r.revenue, r.smallest, r.largest)
                for r in rows}


def batches(engine, p) -> list:
    with engine.connect() as conn:
        return conn.execute(text("SELECT batch_id, kind, status, records_read, rows_written, records_filtered, "
                                 "rows_quarantined, groups_written FROM ledger.batches WHERE pipeline = :p "
                                 "ORDER BY batch_id"), {"p": p.name}).all()


@pytest.mark.parametrize("query, copy_types", [
    (PER_MINUTE, ()),
    (NARROW_SUM, ("text", "timestamptz", "bigint", "numeric(18,2)", "numeric(12,2)", "numeric(12,2)", "bigint")),
], ids=["csv", "binary"])
def test_aggregate_totals_are_exact_and_counted(query, copy_types, engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=3, batch__max_records=150, **{**AGGREGATE, "transform": query})
    assert batch_shape(spark, p.spec).binary_types == copy_types
    records = produce_orders(broker, p, 400, seed=1)
    summary = run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark)
    assert summary.batches >= 2 and summary.records_read == 400
    assert totals(engine, p) == expected_totals(records)
    committed = [b for b in batches(engine, p) if b.status == "committed"]
    assert sum(b.records_read for b in committed) == 400
    assert sum(b.rows_quarantined for b in committed) == 8  # every 50th
    # Aggregated records (filtered ones included: an aggregate's WHERE cannot be told from its grouping).
    assert all(b.records_read == b.rows_written + b.records_filtered + b.rows_quarantined for b in committed)
    assert all(b.groups_written and b.groups_written <= 12 for b in committed)
    assert verify(engine, p.spec) == []


def test_a_replay_after_the_data_changed_leaves_min_and_max_exact(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=2, batch__max_records=60, **AGGREGATE)
    records = produce_orders(broker, p, 200, seed=2)
    run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark)
    assert totals(engine, p) == expected_totals(records)
    before = totals(engine, p)

    # The transform changes (amounts above 40 no longer count), then a replay of partition 0 offsets
    # 10..20: the planner widens it to the whole batches that delivered them.
    path = p.dir / f"{p.name}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["transform"] = PER_MINUTE.replace("amount > 0", "amount > 0 AND amount <= 40")
    path.write_text(yaml.safe_dump(doc))
    spec = p.spec
    batch = plan_replay(engine, spec, resolve_ranges(spec, broker.bootstrap_servers,
                                                     ReplayRequest(p.topic, (0,), from_offset=10, until_offset=20)))
    with engine.connect() as conn:
        delivering = delivering_batches(conn, p.name, batch.ranges, batch.batch_id)
    widened = [r for rs in delivering.values() for r in rs if r.span]
    assert set(batch.ranges) == set(widened)  # whole batches, every partition of them

    process_batch(spark, engine, spec, batch.batch_id, db_url, broker.bootstrap_servers)
    diff = dry_run_diff(engine, spec, batch.batch_id)
    assert diff.changed + diff.removed > 0 and totals(engine, p) == before

    batch = plan_replay(engine, spec, list(batch.ranges))
    process_batch(spark, engine, spec, batch.batch_id, db_url, broker.bootstrap_servers)
    commit_batch(engine, spec, batch.batch_id)
    # Expected: records in the replayed ranges count with the new rule, all others with the old one.
    replayed = {(r.partition, o) for r in batch.ranges for o in range(r.from_offset, r.until_offset)}
    offsets = defaultdict(int)
    old, new = [], []
    for partition, value in records:
        coordinate = (partition, offsets[partition])
        offsets[partition] += 1
        (new if coordinate in replayed else old).append((partition, value))
    capped = [(pt, v) for pt, v in new if b"{not" in v or Decimal(__import__("json").loads(v)["amount"]) <= 40]
    want = expected_totals(old + capped)
    assert totals(engine, p) == want
    assert verify(engine, spec) == []

    # Replaying the same batches again with the same rule changes nothing.
    again = plan_replay(engine, spec, list(batch.ranges))
    process_batch(spark, engine, spec, again.batch_id, db_url, broker.bootstrap_servers)
    commit_batch(engine, spec, again.batch_id)
    assert totals(engine, p) == want
    assert verify(engine, spec) == []


def test_a_backfill_before_a_latest_start_adds_exactly_its_records(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=2, source__start="latest", **AGGREGATE)
    history = produce_orders(broker, p, 80, seed=7)
    assert run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark).batches == 0
    live = produce_orders(broker, p, 60, seed=8, start=80)
    run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark)
    assert totals(engine, p) == expected_totals(live)

    # The history is all of each partition before the live start: a backfill, not a replay.
    before = defaultdict(int)
    for partition, _ in history:
        before[partition] += 1
    batch = plan_replay(engine, p.spec, [OffsetRange(p.topic, pt, 0, n) for pt, n in sorted(before.items())])
    assert batch.kind == "backfill"
    process_batch(spark, engine, p.spec, batch.batch_id, db_url, broker.bootstrap_servers)
    commit_batch(engine, p.spec, batch.batch_id)
    assert totals(engine, p) == expected_totals(history + live)
    assert verify(engine, p.spec) == []


def test_filtering_append_query_counts_what_it_drops(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=2, transform="SELECT *, upper(customer) AS shout FROM batch WHERE amount > 0")
    # its output is staged in the binary COPY format, coordinates and batch id last
    assert batch_shape(spark, p.spec).binary_types == (
        "text", "text", "numeric(12,2)", "timestamptz", "text", "text", "integer", "bigint", "bigint")
    records = produce_orders(broker, p, 140, seed=3)
    summary = run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark)
    import json

    good = [json.loads(v) for _, v in records if not v.startswith(b"{not")]
    kept = [o for o in good if Decimal(o["amount"]) > 0]
    assert summary.records_read == 140
    with engine.connect() as conn:
        rows = conn.execute(text(f'SELECT order_id, shout, _topic, _partition, _offset FROM public."{p.table}"')).all()
    assert sorted(r.order_id for r in rows) == sorted(o["order_id"] for o in kept)
    assert all(r.shout == r.shout.upper() for r in rows)
    b = [x for x in batches(engine, p) if x.status == "committed"]
    assert sum(x.records_filtered for x in b) == len(good) - len(kept)
    assert sum(x.rows_written for x in b) == len(kept)
    assert sum(x.rows_quarantined for x in b) == 140 - len(good)
    assert verify(engine, p.spec) == []


@pytest.mark.parametrize("transform, mode, message", [
    ("SELECT customer, count(*) AS orders FROM batch GROUP BY customer", "append",
     "keeps each row's source coordinates"),
    ("SELECT nosuch FROM batch", "append", "does not run over `batch`"),
    ("SELEKT * FROM batch", "append", "does not run over `batch`"),
    ("SELECT customer, count(*) FROM batch GROUP BY customer", "aggregate", r"'count\(1\)' needs a plain name"),
    ("SELECT customer, sum(amount) AS revenue, max(ts) AS last FROM batch GROUP BY customer", "aggregate",
     "neither in target.key nor in target.measures"),
])
def test_a_bad_query_is_refused_before_anything_is_read(transform, mode, message, engine, db_url, broker, spark,
                                                       make_pipeline):
    extra = dict(target__key=["customer"], target__measures={"revenue": "sum"}) if mode == "aggregate" else {}
    p = make_pipeline(partitions=1, transform=transform, target__mode=mode, **extra)
    produce_orders(broker, p, 5, seed=4)
    with pytest.raises(SpecError, match=message):
        run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark)
    b = batches(engine, p)
    assert len(b) == 1 and b[0].status == "planned" and b[0].records_read is None  # nothing read


@pytest.mark.parametrize("transform, mode, message", [
    ("SELECT b.*, t.tag FROM batch b LATERAL VIEW explode(array('x', 'y')) t AS tag", "append",
     "gave two rows for one record"),
    ("SELECT customer, amount AS revenue FROM batch", "aggregate", "gave two rows for one key"),
])
def test_a_query_giving_two_rows_for_one_record_or_key_fails_the_batch(transform, mode, message, engine, db_url,
                                                                       broker, spark, make_pipeline):
    extra = dict(target__key=["customer"], target__measures={"revenue": "sum"}) if mode == "aggregate" else {}
    p = make_pipeline(partitions=1, transform=transform, target__mode=mode, **extra)
    produce_orders(broker, p, 20, seed=6)
    with pytest.raises(BatchFailedError, match=message):
        run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark)
    [b] = batches(engine, p)
    assert b.status == "failed"
    assert not tables_exist(engine, p)


def tables_exist(engine, p) -> bool:
    with engine.connect() as conn:
        return conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": f"public.{p.table}"}).scalar_one()


def test_spec_load_refusals(make_pipeline):
    with pytest.raises(SpecError, match="must read the view `batch`"):
        make_pipeline(partitions=1, transform="SELECT 1").spec
    with pytest.raises(SpecError, match="needs target.measures"):
        make_pipeline(partitions=1, transform=PER_MINUTE, target__mode="aggregate", target__key=["customer"]).spec
    with pytest.raises(SpecError, match="needs transform: a Spark SQL query"):
        make_pipeline(partitions=1, target__mode="aggregate", target__key=["customer"],
                      target__measures={"amount": "sum"}).spec
    with pytest.raises(SpecError, match="must be one of sum, min, max"):
        make_pipeline(partitions=1, **{**AGGREGATE, "target__measures": {"orders": "avg"}}).spec


def test_replay_cli(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=2, **AGGREGATE)
    records = produce_orders(broker, p, 60, seed=5)
    run = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert run.returncode == 0, run.stderr[-3000:]
    want = expected_totals(records)
    assert totals(engine, p) == want

    dry = cli(["replay", p.name, "--partitions", "0", "--from-offset", "0", "--until-offset", "5", "--dry-run"],
              db_url, broker.bootstrap_servers, p.dir)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "replay batch" in dry.stdout and "dry run, target unchanged" in dry.stdout
    assert "0 added, 0 removed, 0 changed" in dry.stdout

    done = cli(["replay", p.name, "--from-offset", "0", "--until-offset", "3"], db_url, broker.bootstrap_servers, p.dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "committed in one transaction" in done.stdout
    assert totals(engine, p) == want
    assert verify(engine, p.spec) == []

    for args, refusal in [
        (["--from-offset", "0", "--until-offset", "500"], "past the log end"),
        (["--topic", "nope", "--from-offset", "0", "--until-offset", "1"], "is not a source"),
        (["--from-offset", "3", "--until-offset", "3"], "0 <= from < until"),
        ([], "give either from/until offsets or a from/until time window"),
        (["--partitions", "9", "--from-offset", "0", "--until-offset", "1"], r"no partition\(s\) \[9\]"),
    ]:
        refused = cli(["replay", p.name, *args], db_url, broker.bootstrap_servers, p.dir)
        assert refused.returncode == 1, (args, refused.stderr[-2000:])
        assert __import__("re").search(refusal, refused.stderr), (args, refused.stderr[-2000:])
    (_, offset, _), = produce(broker.bootstrap_servers, p.topic, [(0, order(1000, "1.00", 0, 0))])
    ahead = cli(["replay", p.name, "--partitions", "0", "--from-offset", "0", "--until-offset", str(offset + 1)],
                db_url, broker.bootstrap_servers, p.dir)
    assert ahead.returncode == 1 and "neither fully delivered" in ahead.stderr, ahead.stderr[-2000:]


@pytest.mark.parametrize("point", list(EXPECTED_AFTER_CRASH))
def test_sigkill_at_each_crash_point_leaves_totals_exact(point, engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=3, batch__max_records=120, **AGGREGATE)
    records = produce_orders(broker, p, 300, seed=10)
    crashed = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir, LEDGERBATCH_CRASH_AT=point)
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    b = first_batch(engine, p)
    assert (b.status, b.attempt) == EXPECTED_AFTER_CRASH[point]
    resumed = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert totals(engine, p) == expected_totals(records)
    assert verify(engine, p.spec) == []


def test_random_sigkills_while_producing_leave_totals_exact(engine, db_url, broker, make_pipeline):
    """Records keep arriving while `ledgerbatch run` is SIGKILLed (its whole process group: driver,
    JVM, Python workers) at random moments; after a last clean run the totals are exact."""
    p = make_pipeline(partitions=3, batch__max_records=90, **AGGREGATE)
    rnd = random.Random(11)
    records, kills = [], 0
    for round_ in range(4):
        records += produce_orders(broker, p, 150, seed=20 + round_, start=150 * round_)
        run = _popen_run(p, db_url, broker)
        time.sleep(rnd.uniform(3, 12))
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            kills += 1
        run.communicate(timeout=60)
    final = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert final.returncode == 0, final.stderr[-2000:]
    assert kills >= 2
    assert totals(engine, p) == expected_totals(records)
    assert sum(b.records_read for b in batches(engine, p) if b.status == "committed") == len(records)
    assert verify(engine, p.spec) == []

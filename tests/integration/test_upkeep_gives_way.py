"""Nothing of history stops a pipeline (issue #49): a partition rollup merges the rows the target holds as they
are (a CHECK the user added NOT VALID does not judge them); a rollup or compaction that fails for a reason of
the target's own (a foreign key referencing it, a view on one partition, a statement timeout) gives way:
logged once, counted in `ledgerbatch_upkeep_failures_total`, and commits go on; a replay or backfill nobody
will finish (an interrupted `verify --deep`) does not stop compaction. Batches staged by hand (staged.py)."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from ledgerbatch.commit.modes.append import partitions_of
from ledgerbatch.commit.modes.rollup import bound_partitions, roll_up
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.model.batch import BatchKind
from ledgerbatch.model.ranges import Watermarks
from ledgerbatch.ops import upkeep_failures
from ledgerbatch.ops.abandon import abandon_stranded
from ledgerbatch.ops.deep_verify import deep_verify
from ledgerbatch.ops.history import Upkeeper, compact, upkeep
from ledgerbatch.ops.verify import verify
from ledgerbatch.source import kafka

from .staged import batch, begin, plan, respec, staged_batch

pytestmark = pytest.mark.integration
NOW = datetime.now(timezone.utc)


def pipe(make_pipe, bound: int = 2, compact_after: str | None = None, **kw):
    p = make_pipe(max_ratio=0.9, **kw)
    extra = {"target": {"table": f"public.{p.table}", "mode": "append",
                        "partitions": {"max": bound, "attach_min_rows": 1}}}
    if compact_after:
        extra["history"] = {"compact_after": compact_after}
    respec(p, **extra)
    return p


class Deliveries:
    """Live batches of partition 0, `n` records each, committed as `run` does (commit, then the bound)."""

    def __init__(self, engine, p, amount: str = "1.00", start: int = 0):
        self.engine, self.p, self.offset, self.amount = engine, p, start, amount

    def __call__(self, n: int = 2, amount: str | None = None, bound: bool = True) -> int:
        lo, hi = self.offset, self.offset + n
        s = staged_batch(self.engine, self.p, {0: (lo, hi)},
                         good=[(0, o, f"o-{o}", amount or self.amount) for o in range(lo, hi)])
        commit_batch(self.engine, self.p.spec, s.batch_id)
        if bound:
            bound_partitions(self.engine, self.p.spec)
        self.offset = hi
        return s.batch_id


def n_partitions(engine, p) -> int:
    with engine.connect() as conn:
        return len(partitions_of(conn, p.spec))


def sql(engine, statement: str, **params):
    with engine.begin() as conn:
        return conn.execute(text(statement), params)


def failures(pipeline: str, upkeep: str) -> dict[str, int]:
    """SQLSTATE (or error type) -> failures counted for the pipeline's upkeep."""
    return {sqlstate or error: n for (p, u, error, sqlstate), n in upkeep_failures.failure_counts().items()
            if p == pipeline and u == upkeep}


def gave_way_warnings(caplog, pipeline: str, upkeep: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.getMessage().startswith(f"{pipeline}: upkeep {upkeep} gave way")]


def test_a_not_valid_check_does_not_judge_the_rows_a_rollup_merges(engine, make_pipe):
    p = pipe(make_pipe)
    deliver = Deliveries(engine, p)
    deliver(amount="-1.00")  # a refund was a fine record when it was delivered
    deliver()
    sql(engine, f'ALTER TABLE public."{p.table}" ADD CONSTRAINT positive CHECK (amount > 0) NOT VALID')
    deliver(bound=False)
    assert n_partitions(engine, p) == 3
    merged = bound_partitions(engine, p.spec)
    assert len(merged) == 1 and n_partitions(engine, p) == 2
    assert failures(p.name, "rollup") == {}
    with engine.connect() as conn:  # the merged partition has the rule as the target has it: NOT VALID
        checks = dict(conn.execute(text(
            "SELECT c.relname, k.convalidated FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid "
            "WHERE k.conname = 'positive' AND c.relnamespace = 'public'::regnamespace AND c.relname LIKE :t"),
            {"t": f"{p.table}%"}).all())
    assert checks[p.table] is False and checks[merged[0].into] is False
    assert sorted(r[0] for r in sql(engine, f'SELECT amount FROM public."{p.table}"')) == [-1, -1, 1, 1, 1, 1]
    with pytest.raises(IntegrityError, match="positive"):  # and it judges new rows, in the merged partition too
        sql(engine, f"INSERT INTO public.\"{p.table}\" (order_id, amount, _topic, _partition, _offset, _batch_id) "
                    f"VALUES ('x', -5, 't', 0, 99, {merged[0].lower})")
    deliver(), deliver()  # the pipeline goes on, merging as it goes
    assert n_partitions(engine, p) <= 2 and verify(engine, p.spec) == []


@contextmanager
def held(engine, *statements: str):
    """Another session holding locks (or anything) until the block ends."""
    conn = engine.connect()
    try:
        for s in statements:
            conn.execute(text(s))
        yield conn
    finally:
        conn.rollback()
        conn.close()


@pytest.fixture
def timeout_engine(db_url):
    """The ledger's server with a statement_timeout of 300 ms, as a role or database setting may give."""
    e = create_engine(db_url, connect_args={"options": "-c statement_timeout=300"})
    yield e
    e.dispose()


def test_a_rollup_the_targets_own_rules_refuse_gives_way_and_commits_go_on(engine, make_pipe, caplog,
                                                                           monkeypatch):
    """A view on one partition (DROP of it: 2BP01) fails every rollup: each gives way, warned about once,
    counted; every commit goes on; the next commits leave the target alone for a while; once the view is gone
    the next rollup merges."""
    p = pipe(make_pipe)
    deliver = Deliveries(engine, p)
    deliver(), deliver()
    first = partitions_of(engine.connect(), p.spec)[0].name
    sql(engine, f'CREATE VIEW public."{p.table}_first" AS SELECT * FROM public."{first}"')
    caplog.set_level(logging.INFO)
    for _ in range(3):
        deliver()  # commit, then bound_partitions (as run and the Airflow commit task do): never raises
    assert n_partitions(engine, p) == 5
    assert failures(p.name, "rollup") == {"2BP01": 1}  # the next two commits came within its 5 s rest
    assert 0 < upkeep_failures.resting(p.name, "rollup") <= upkeep_failures.REST_FIRST_S
    monkeypatch.setattr(upkeep_failures, "REST_FIRST_S", 0.0)
    deliver(), deliver()
    assert failures(p.name, "rollup") == {"2BP01": 3}
    warned = gave_way_warnings(caplog, p.name, "rollup")
    assert len(warned) == 1 and "2BP01" in warned[0] and "depend" in warned[0], warned
    assert upkeep_failures.failing(p.name)["rollup"].startswith("InternalError (SQLSTATE 2BP01)")
    done = upkeep(engine, p.spec)
    assert done.gave_way == ("rollup",) and done.rollups == ()
    sql(engine, f'DROP VIEW public."{p.table}_first"')
    assert len(bound_partitions(engine, p.spec)) >= 1 and n_partitions(engine, p) <= 2
    assert "rollup" not in upkeep_failures.failing(p.name)
    assert any("upkeep rollup works again" in r.getMessage() for r in caplog.records)
    assert verify(engine, p.spec) == []


def test_a_foreign_key_referencing_the_target_makes_the_rollup_give_way(engine, make_pipe, monkeypatch):
    monkeypatch.setattr(upkeep_failures, "REST_FIRST_S", 0.0)  # every commit tries it again
    p = pipe(make_pipe)
    t = f'public."{p.table}"'
    sql(engine, f"""
        CREATE TABLE {t} (order_id text, customer text, amount numeric(12,2), ts timestamptz,
            _topic text NOT NULL, _partition integer NOT NULL, _offset bigint NOT NULL, _batch_id bigint NOT NULL,
            UNIQUE (_topic, _partition, _offset, _batch_id)) PARTITION BY RANGE (_batch_id)""")
    deliver = Deliveries(engine, p)
    first = deliver()
    deliver()  # the first batch's partition is closed now (a row of the open one cannot be referenced: see below)
    sql(engine, f"""CREATE TABLE public."{p.table}_refund" (topic text, partition int, "offset" bigint, batch_id bigint,
                    FOREIGN KEY (topic, partition, "offset", batch_id) REFERENCES {t} (_topic, _partition, _offset, _batch_id));
                    INSERT INTO public."{p.table}_refund" VALUES ('{p.topic}', 0, 0, {first})""")
    deliver(), deliver()
    assert n_partitions(engine, p) == 4 and failures(p.name, "rollup") == {"23503": 2}
    deliver()
    assert batch(engine, deliver() - 1).status == "committed" and verify(engine, p.spec) == []


def test_a_rollup_past_the_statement_timeout_gives_way(engine, timeout_engine, make_pipe):
    p = pipe(make_pipe)
    deliver = Deliveries(engine, p)
    deliver(), deliver(), deliver(bound=False)
    first = partitions_of(engine.connect(), p.spec)[0].name
    with held(engine, f'LOCK TABLE public."{first}" IN ACCESS EXCLUSIVE MODE'):  # a long maintenance of it
        assert roll_up(timeout_engine, p.spec) is None
    assert failures(p.name, "rollup") == {"57014": 1}
    assert roll_up(timeout_engine, p.spec) is not None and n_partitions(engine, p) == 2


def test_a_compaction_that_fails_gives_way_and_the_rest_of_the_upkeep_runs(engine, timeout_engine, make_pipe):
    p = pipe(make_pipe, bound=16, compact_after="1s")
    deliver = Deliveries(engine, p)
    deliver(), deliver()
    key = f"ledgerbatch:compact:{p.name}"
    with held(engine, f"SELECT pg_advisory_xact_lock(hashtext('{key}'))"):  # another compaction, stuck
        done = upkeep(timeout_engine, p.spec, datetime.now(timezone.utc) + timedelta(minutes=1))
        hook = Upkeeper(timeout_engine, p.spec, every_s=0)
        hook.between_batches()  # what run does between batches: it does not raise either
    assert done.compacted is None and done.gave_way == ("compaction",)
    assert failures(p.name, "compaction") == {"57014": 2}
    deliver()
    done = upkeep(engine, p.spec, datetime.now(timezone.utc) + timedelta(minutes=1))
    assert done.gave_way == () and done.compacted.batches == 3 and verify(engine, p.spec) == []


def test_an_upkeep_that_keeps_failing_rests_longer_each_time(make_pipe, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(upkeep_failures.time, "monotonic", lambda: clock[0])
    name = make_pipe().name
    rests = []
    for _ in range(9):
        upkeep_failures.gave_way(name, "rollup", TimeoutError("made up"))
        rests.append(upkeep_failures.resting(name, "rollup"))
    assert rests == [5, 10, 20, 40, 80, 160, 300, 300, 300]
    clock[0] += 299
    assert upkeep_failures.resting(name, "rollup") == 1
    upkeep_failures.worked(name, "rollup")
    assert upkeep_failures.resting(name, "rollup") == 0 and "rollup" not in upkeep_failures.failing(name)


def test_upkeep_failures_are_a_prometheus_counter(engine, make_pipe):
    prometheus_client = pytest.importorskip("prometheus_client")
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    from ledgerbatch.ops.metrics import Metrics

    p = pipe(make_pipe)
    upkeep_failures.gave_way(p.name, "compaction", TimeoutError("made up"))
    upkeep_failures.gave_way(p.name, "compaction", TimeoutError("made up"))
    m = Metrics([PrometheusMetricReader()])  # registers with prometheus_client's REGISTRY, as serve_prometheus does
    try:
        exposed = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    finally:
        m.provider.shutdown()
    line = next(line for line in exposed.splitlines()
                if line.startswith("ledgerbatch_upkeep_failures_total{") and p.name in line)
    assert 'ledgerbatch_upkeep="compaction"' in line and 'error_type="TimeoutError"' in line
    assert line.endswith(" 2.0")


def test_the_upkeep_abandons_stranded_replays_and_backfills_so_compaction_goes_on(engine, make_pipe, caplog):
    p = pipe(make_pipe, bound=16, compact_after="60s")
    deliver = Deliveries(engine, p, start=10)
    deliver(), deliver()
    stranded_replay = plan(engine, p, {0: (10, 12)}, BatchKind.REPLAY)  # an interrupted `ledgerbatch replay`
    begun = begin(engine, p, plan(engine, p, {0: (10, 12)}, BatchKind.REPLAY)).batch_id  # its lease lapsed
    staged_backfill = staged_batch(engine, p, {0: (0, 2)}, good=[(0, 0, "b-0", "1.00"), (0, 1, "b-1", "1.00")],
                                   kind=BatchKind.BACKFILL).batch_id  # a backfill DAG run that failed at its commit
    held_replay = begin(engine, p, plan(engine, p, {0: (12, 14)}, BatchKind.REPLAY)).batch_id  # being staged now
    deliver(), deliver()
    recent_replay = plan(engine, p, {0: (14, 16)}, BatchKind.REPLAY)
    deliver()
    hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    age = ("UPDATE ledger.batches SET updated_at = :t, committed_at = CASE WHEN committed_at IS NOT NULL THEN :t END, "
           "heartbeat_at = CASE WHEN batch_id = :held THEN now() ELSE :t END "
           "WHERE pipeline = :p AND batch_id BETWEEN :lo AND :hi")
    sql(engine, age, t=hour_ago, held=held_replay, p=p.name, lo=0, hi=recent_replay - 1)
    caplog.set_level(logging.INFO)

    by_hand = compact(engine, p.spec, datetime.now(timezone.utc) - timedelta(seconds=60))  # names what stops it
    assert by_hand.stopped_at == stranded_replay and by_hand.through == stranded_replay - 1
    assert any(f"compaction stops before replay batch {stranded_replay}" in r.getMessage() for r in caplog.records)

    abandoned = abandon_stranded(engine, p.spec, datetime.now(timezone.utc) - timedelta(seconds=60))
    assert [(s.batch_id, s.kind, s.was) for s in abandoned] == [
        (stranded_replay, "replay", "planned"), (begun, "replay", "planned"), (staged_backfill, "backfill", "staged")]
    errors = dict(sql(engine, "SELECT batch_id, error FROM ledger.batches WHERE batch_id IN (:a, :b)",
                      a=stranded_replay, b=staged_backfill).all())
    assert errors[stranded_replay].startswith("abandoned by the upkeep") and "planned at attempt 0" in errors[stranded_replay]
    assert "staged at attempt 1" in errors[staged_backfill]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and ": abandoned " in r.getMessage()]
    assert len(warned) == 3 and f"replay batch {stranded_replay}, planned at attempt 0" in warned[0], warned
    assert batch(engine, held_replay).status == "planned" and batch(engine, recent_replay).status == "planned"

    done = upkeep(engine, p.spec)  # folds past the abandoned ones, up to the replay someone is staging
    assert done.abandoned == () and done.gave_way == ()
    assert done.compacted.through == held_replay - 1 and done.compacted.stopped_at == held_replay
    another = plan(engine, p, {0: (16, 18)}, BatchKind.REPLAY)
    sql(engine, age, t=hour_ago, held=held_replay, p=p.name, lo=another, hi=another)
    done = upkeep(engine, p.spec)
    assert [s.batch_id for s in done.abandoned] == [another] and batch(engine, another).status == "abandoned"
    assert verify(engine, p.spec) == []


def test_an_interrupted_verify_deep_abandons_its_batch(engine, db_url, make_pipe, monkeypatch):
    p = pipe(make_pipe, bound=16, compact_after="1s")
    deliver = Deliveries(engine, p)
    deliver(), deliver()
    monkeypatch.setattr(kafka, "watermarks", lambda servers, topics, options=None: {
        (t, part): Watermarks(0, 1000) for t in topics for part in range(1)})

    def ctrl_c():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        deep_verify(engine, p.spec, db_url, "unused:9092", ctrl_c)
    unfinished = sql(engine, "SELECT batch_id, status, error FROM ledger.batches WHERE pipeline = :p AND kind = "
                             "'replay'", p=p.name).all()
    assert len(unfinished) == 1 and unfinished[0].status == "abandoned"
    assert "verify --deep stopped" in unfinished[0].error and "KeyboardInterrupt" in unfinished[0].error
    deliver()
    done = upkeep(engine, p.spec, datetime.now(timezone.utc) + timedelta(minutes=1))
    assert done.compacted.batches == 4 and done.compacted.stopped_at is None


def test_the_airflow_commit_task_does_not_fail_when_the_rollup_does(engine, make_pipe, monkeypatch):
    """CommitOperator commits, then keeps the bound: a rollup that fails there gives way."""
    p = pipe(make_pipe)
    deliver = Deliveries(engine, p)
    deliver(), deliver()
    first = partitions_of(engine.connect(), p.spec)[0].name
    sql(engine, f'CREATE VIEW public."{p.table}_v" AS SELECT * FROM public."{first}"')
    s = staged_batch(engine, p, {0: (deliver.offset, deliver.offset + 1)}, good=[(0, deliver.offset, "x", "1.00")])
    from ledgerbatch.airflow import operators

    task = operators.CommitBatchOperator(task_id="commit", pipeline=p.name, pipelines_dir=str(p.dir),
                                         batch_id=str(s.batch_id))
    monkeypatch.setattr(task, "_engine_and_spec", lambda: (engine, p.spec))
    monkeypatch.setattr(task, "_phase_event", lambda *a, **k: None)  # metrics, asset events: not this test's
    monkeypatch.setattr(task, "_publish", lambda *a, **k: None)
    monkeypatch.setattr(operators, "record_lag", lambda *a, **k: None)
    task.__dict__["kafka_hook"] = type("Kafka", (), {"get_bootstrap_servers": lambda self: "unused:9092"})()
    result = task.execute({})
    assert "1 row written" in result and batch(engine, s.batch_id).status == "committed"
    assert failures(p.name, "rollup") == {"2BP01": 1}


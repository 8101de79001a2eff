"""What the follower waits out and what stops it, decided by ops/outages.py, on errors the real server raises.

Each SQLSTATE is raised on a real connection (`RAISE ... USING ERRCODE`, or for real where it is cheap: a
statement_timeout on a lock wait and on a slow statement, a cancel by hand, a read-only transaction, an
index row over the btree maximum, a terminated backend, a refused login) and the exception SQLAlchemy
gives is fed to the decision. Then the follower itself: a batch over errors.max_ratio and a commit cut by
statement_timeout end it with their reason; a Kafka outage while batch.max_bytes measures is waited out."""
import logging
import threading
import time

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from ledgerbatch.errors import BatchFailedError, LedgerbatchError
from ledgerbatch.ledger.batches import mark_staged
from ledgerbatch.model.ranges import Watermarks
from ledgerbatch.ops import run as run_module
from ledgerbatch.ops.hooks import RunHook
from ledgerbatch.ops.outages import DATABASE, Backoff, Kind, decide, waitable
from ledgerbatch.ops.run import run_pipeline
from ledgerbatch.sqlfiles import query
from ledgerbatch.stage import process
from ledgerbatch.stage.tables import StagingTables

from .staged import staged_batch, target

OUTAGES = ["08000", "08003", "08006", "25006", "40001", "40P01", "53000", "53100", "53300", "55P03", "57P01",
           "57P02", "57P03"]
STOPS = ["54000", "54001", "53400", "42501", "42P01", "57P04", "57000", "58030", "XX000", "XX001", "55000",
         "0A000", "22001", "22012", "23505", "23514", "P0001", "P0004", "LB001", "40002", "25P02"]


def raised(engine, sql: str, params: dict | None = None) -> DBAPIError:
    with engine.connect() as conn:
        with pytest.raises(DBAPIError) as caught:
            conn.execute(text(sql), params or {})
        conn.rollback()
    return caught.value


@pytest.mark.parametrize("code", OUTAGES + STOPS)
def test_each_sqlstate_raised_by_the_server_is_decided(engine, code):
    exc = raised(engine, f"DO $$ BEGIN RAISE EXCEPTION 'raised with {code}' USING ERRCODE = '{code}'; END $$")
    assert exc.orig.pgcode == code
    assert waitable(exc) == (DATABASE if code in OUTAGES else None), decide(exc)


def test_a_statement_timeout_on_an_advisory_lock_wait_is_waited_out(engine):
    """Another runner's commit (or a rollup, a compaction) holds the target's lock longer than the role's
    statement_timeout: waiting fixes it."""
    with engine.connect() as holder:
        holder.execute(text(query("target_lock")), {"target": "public.decided"})
        exc = raised(engine, "SET statement_timeout = '200ms'; " + query("target_lock"), {"target": "public.decided"})
        holder.rollback()
    assert exc.orig.pgcode == "57014" and waitable(exc) == DATABASE


def test_a_statement_timeout_on_a_slow_statement_stops_with_what_to_do(engine):
    exc = raised(engine, "SET statement_timeout = '100ms'; SELECT pg_sleep(2)")
    assert exc.orig.pgcode == "57014" and waitable(exc) is None
    assert decide(exc).kind is Kind.OPERATOR and "statement_timeout" in decide(exc).todo


def test_a_statement_canceled_by_hand_is_waited_out(engine):
    with engine.connect() as victim:
        pid = victim.execute(text("SELECT pg_backend_pid()")).scalar_one()
        threading.Timer(0.3, _cancel, (engine, pid)).start()
        with pytest.raises(DBAPIError) as caught:
            victim.execute(text("SELECT pg_sleep(5)"))
        victim.rollback()
    assert caught.value.orig.pgcode == "57014" and waitable(caught.value) == DATABASE


def _cancel(engine, pid: int) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_cancel_backend(:p)"), {"p": pid})


def test_a_read_only_transaction_is_waited_out(engine):
    exc = raised(engine, "SET TRANSACTION READ ONLY; CREATE TABLE public.never_made (a int)")
    assert exc.orig.pgcode == "25006" and waitable(exc) == DATABASE


def test_an_index_row_over_the_btree_maximum_is_not_an_outage(engine):
    exc = raised(engine, "CREATE TEMP TABLE long_keys (k text PRIMARY KEY); "
                         "INSERT INTO long_keys SELECT string_agg(md5(g::text), '') FROM generate_series(1, 200) g")
    assert exc.orig.pgcode == "54000" and waitable(exc) is None and decide(exc).kind is Kind.RECORD


def test_a_triggers_own_code_is_the_records_fault(engine):
    exc = raised(engine, """
        CREATE TEMP TABLE guarded (a int);
        CREATE FUNCTION pg_temp.refuse() RETURNS trigger LANGUAGE plpgsql AS
          $$ BEGIN RAISE EXCEPTION 'not this one' USING ERRCODE = 'LB001'; END $$;
        CREATE TRIGGER refuse BEFORE INSERT ON guarded FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse();
        INSERT INTO guarded VALUES (1)""")
    assert exc.orig.pgcode == "LB001" and waitable(exc) is None and decide(exc).kind is Kind.RECORD


def test_a_terminated_backend_and_a_refused_connection_are_outages_a_refused_login_is_not(engine, db_url):
    with engine.connect() as victim:
        pid = victim.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with engine.connect() as admin:
            admin.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        with pytest.raises(DBAPIError) as terminated:
            victim.execute(text("SELECT 1"))
    assert waitable(terminated.value) == DATABASE
    for url, expected in ((make_url(db_url).set(port=1), DATABASE),
                          (make_url(db_url).set(username="no_such_role_lb"), None)):
        other = create_engine(url)
        with pytest.raises(DBAPIError) as refused:
            other.connect()
        other.dispose()
        assert waitable(refused.value) == expected, refused.value


# -- the follower itself

class _Nothing(RunHook):
    def __init__(self, *args, **kwargs):
        pass


@pytest.fixture
def follower(monkeypatch, caplog):
    """run_pipeline's own loop without Spark or Kafka: no warm-up, no lag sampler."""
    monkeypatch.setattr(run_module, "WarmStart", _Nothing)
    monkeypatch.setattr(run_module, "LagSampler", _Nothing)
    caplog.set_level(logging.INFO, logger="ledgerbatch")

    def follow(engine, p, db_url, seconds: float, bootstrap: str = "127.0.0.1:1"):
        stop = threading.Event()
        threading.Timer(seconds, stop.set).start()
        try:
            return run_pipeline(engine, p.spec, db_url, bootstrap, spark_factory=lambda: None, follow_idle_s=0.1,
                                stop=stop, backoff=Backoff(0.1, 0.3))
        finally:
            stop.set()
    return follow


def test_a_batch_over_its_error_budget_ends_the_follower_with_the_budget_message(engine, db_url, make_pipe, follower,
                                                                                 monkeypatch, caplog):
    p = make_pipe(max_ratio=0.5)
    monkeypatch.setattr("ledgerbatch.source.kafka.watermarks",
                        lambda servers, topics, options=None: {(t, 0): Watermarks(0, 10) for t in topics})

    def every_record_bad(spark, engine_, spec, job):
        with engine.begin() as conn:
            for r in job.ranges:
                conn.execute(text(f'INSERT INTO ledger_staging."{StagingTables(job.table.name).bad}" (_topic, _partition, '
                                  "_offset, _error, _key, _value) SELECT :t, :p, g, 'value is not JSON', NULL, "
                                  "'\\xff'::bytea FROM generate_series(:lo, :hi - 1) g"),
                             {"t": r.topic, "p": r.partition, "lo": r.from_offset, "hi": r.until_offset})
            mark_staged(conn, job.batch_id, job.attempt, job.table.name, job.ranges,
                        {r.topic_partition: (r.span, r.span) for r in job.ranges})

    monkeypatch.setattr(process, "stage_batch", every_record_bad)
    with pytest.raises(BatchFailedError, match="more than errors.max_ratio"):
        follower(engine, p, db_url, 10.0)
    assert not [r for r in caplog.records if "outage started" in r.getMessage()]


def test_a_commit_cut_by_statement_timeout_ends_the_follower_with_what_to_do(engine, db_url, make_pipe, follower):
    p = make_pipe(mode="append")
    first = staged_batch(engine, p, {0: (0, 1)}, good=[(0, 0, "o-0", "1.00")])
    from ledgerbatch.commit.transaction import commit_batch

    commit_batch(engine, p.spec, first.batch_id)  # the target exists; now every INSERT into it is slow
    with engine.begin() as conn:
        conn.execute(text(f"""
            CREATE FUNCTION public.slow_{p.name}() RETURNS trigger LANGUAGE plpgsql AS
              $$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$;
            CREATE TRIGGER slow BEFORE INSERT ON public."{p.table}" FOR EACH STATEMENT
              EXECUTE FUNCTION public.slow_{p.name}()"""))
    staged_batch(engine, p, {0: (1, 2)}, good=[(0, 1, "o-1", "1.00")])
    short = create_engine(db_url, connect_args={"options": "-c statement_timeout=400"})
    try:
        with pytest.raises(LedgerbatchError, match="statement_timeout") as stopped:
            follower(short, p, db_url, 15.0)
    finally:
        short.dispose()
    assert "SQLSTATE 57014" in str(stopped.value) and "not an outage" in str(stopped.value)
    assert len(target(engine, p)) == 1  # the staged batch stays for the next run


def test_a_kafka_outage_while_max_bytes_measures_is_waited_out(engine, db_url, make_pipe, follower, monkeypatch,
                                                               caplog):
    from ledgerbatch.source import sizes

    p = make_pipe()
    doc = (p.dir / f"{p.name}.yaml")
    doc.write_text(doc.read_text() + "batch:\n  max_bytes: 1024\n")
    from ledgerbatch.spec.pipeline import load_spec

    p.spec = load_spec(p.dir, p.name)
    monkeypatch.setattr(sizes, "STALL_S", 0.5)  # every broker down: the measurement's read stalls
    monkeypatch.setattr("ledgerbatch.source.kafka.watermarks",  # the look answered just before they went
                        lambda servers, topics, options=None: {(t, 0): Watermarks(0, 100) for t in topics})
    started = time.monotonic()
    follower(engine, p, db_url, 3.0)  # still following when stopped
    assert time.monotonic() - started >= 2.5
    lines = [r.getMessage() for r in caplog.records]
    assert any("outage started: Kafka unavailable (Kafka stopped answering while batch.max_bytes" in line
               for line in lines), lines

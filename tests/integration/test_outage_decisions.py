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


def test_a_follower_started_while_the_database_is_away_waits_for_it(engine, db_url, make_pipe, follower, monkeypatch,
                                                                    caplog):
    """Its start-up (the warm-up, the staging tables left behind) is inside the outage handling: a service
    started during an outage waits it out, as it would later, instead of stopping each of its pipelines."""
    p = make_pipe(mode="append")
    s = staged_batch(engine, p, {0: (0, 1)}, good=[(0, 0, "o-0", "1.00")])
    starts = []

    class DatabaseAwayAtFirst(RunHook):
        def __init__(self, *args, **kwargs):
            pass

        def started(self, session):
            starts.append(time.monotonic())
            if len(starts) == 1:
                create_engine(make_url(db_url).set(port=1)).connect()  # refused: the database's outage
    monkeypatch.setattr(run_module, "WarmStart", DatabaseAwayAtFirst)
    summary = follower(engine, p, db_url, 3.0)
    assert len(starts) == 2 and summary.batches == 1
    assert [row[-1] for row in target(engine, p)] == [s.batch_id]
    lines = [r.getMessage() for r in caplog.records]
    assert any("outage started: database unavailable" in line for line in lines), lines


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


# -- errors that repeat are not outages: refusals decided at once, the rest by repetition

def _answering_kafka(monkeypatch, high: int = 10):
    monkeypatch.setattr("ledgerbatch.source.kafka.watermarks",
                        lambda servers, topics, options=None: {(t, 0): Watermarks(0, high) for t in topics})


def test_a_grant_revoked_from_the_staging_tasks_role_ends_the_follower_at_once(engine, db_url, make_pipe, follower,
                                                                               monkeypatch, caplog):
    """The staging tasks' role loses USAGE on ledger_staging: every attempt's COPY would fail the same way, so
    the first 42501 (as its text crosses Spark) ends the follower with the grant to give."""
    p = make_pipe()
    _answering_kafka(monkeypatch)
    role = f"lb_staging_{p.name}"
    with engine.begin() as conn:
        conn.execute(text(f'CREATE ROLE "{role}" NOLOGIN; GRANT USAGE ON SCHEMA ledger_staging TO "{role}"; '
                          f'REVOKE USAGE ON SCHEMA ledger_staging FROM "{role}"'))

    def copy_as_the_role(spark, engine_, spec, job):
        with engine.begin() as conn:
            conn.execute(text(f'SET LOCAL ROLE "{role}"'))
            conn.execute(text(f'INSERT INTO ledger_staging."{job.table.name}" (_topic) VALUES (:t)'), {"t": p.topic})

    monkeypatch.setattr(process, "stage_batch", copy_as_the_role)
    try:
        with pytest.raises(LedgerbatchError, match="permission denied for schema ledger_staging") as stopped:
            follower(engine, p, db_url, 10.0)
    finally:
        with engine.begin() as conn:
            conn.execute(text(f'DROP ROLE "{role}"'))
    assert "not an outage" in str(stopped.value) and "grant the role" in str(stopped.value)
    assert not [r for r in caplog.records if "outage started" in r.getMessage()]


def test_a_registry_answering_401_ends_the_follower_at_once(engine, db_url, make_pipe, follower, monkeypatch, caplog):
    """The dev registry with basic auth answers 401 to the product's Avro decoder without the credentials."""
    from ledgerbatch.dev.registry import DevRegistry
    from ledgerbatch.formats.decoders.avro import AvroDecoder

    p = make_pipe()
    _answering_kafka(monkeypatch)
    with DevRegistry(user_info="ledgerbatch:secret") as registry:
        def decode_with_stale_credentials(spark, engine_, spec, job):
            AvroDecoder({"url": registry.url}).decode(b"\x00\x00\x00\x00\x01\x02")

        monkeypatch.setattr(process, "stage_batch", decode_with_stale_credentials)
        with pytest.raises(LedgerbatchError, match="schema registry answered 401") as stopped:
            follower(engine, p, db_url, 10.0)
        assert registry.requests["schemas/ids"] >= 1
    assert "not an outage" in str(stopped.value) and "basic.auth.user.info" in str(stopped.value)
    assert not [r for r in caplog.records if "outage started" in r.getMessage()]


def test_a_staging_error_repeating_while_the_database_and_kafka_answer_ends_the_follower(engine, db_url, make_pipe,
                                                                                       follower, monkeypatch, broker,
                                                                                       caplog):
    """A decoder's bug raising on every record fails each attempt the same way: presumed Spark's outage, it
    is waited out until it has repeated same_error_limit times while the real broker and database answer."""
    from .helpers import produce

    p = make_pipe()
    broker.create_topic(p.topic, 1)
    produce(broker.bootstrap_servers, p.topic, [(0, b'{"order_id": "o-1"}')] * 3)
    attempts = []

    def decoder_bug(spark, engine_, spec, job):
        attempts.append(job.attempt)
        raise TypeError("'NoneType' object is not subscriptable")

    monkeypatch.setattr(process, "stage_batch", decoder_bug)
    stop = threading.Event()  # the follower's own loop (the fixture's quiet hooks) against the real broker
    threading.Timer(60, stop.set).start()
    try:
        with pytest.raises(LedgerbatchError, match="the same error 4 times in a row while the database and Kafka "
                                                   "answer") as stopped:
            run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, spark_factory=lambda: None,
                         follow_idle_s=0.1, stop=stop, backoff=Backoff(0.05, 0.1, same_error_limit=4))
    finally:
        stop.set()
    assert len(attempts) == 4 and len(set(attempts)) == 4  # a new attempt each time, the same error
    assert f"attempt {attempts[-1]} failed: 'NoneType' object is not subscriptable" in str(stopped.value)
    assert "ledger.batches" in str(stopped.value)
    assert [r for r in caplog.records if "outage started: Spark unavailable" in r.getMessage()]


# -- a statement_timeout on a lock wait: the target's outage, or the operator's timeout

def test_a_commit_waiting_for_a_users_lock_on_the_target_is_waited_out_and_names_the_holder(engine, db_url,
                                                                                           make_pipe, follower,
                                                                                           caplog):
    """A user's long transaction holds a SHARE lock on the target; the commit's lock_timeout (9/10 of the role's
    statement_timeout) ends its wait for it (55P03), rolling it back whole: the target's outage, logged with who
    holds the lock, committed after."""
    p = make_pipe(mode="append")
    first = staged_batch(engine, p, {0: (0, 1)}, good=[(0, 0, "o-0", "1.00")])
    from ledgerbatch.commit.transaction import commit_batch

    commit_batch(engine, p.spec, first.batch_id)
    staged_batch(engine, p, {0: (1, 2)}, good=[(0, 1, "o-1", "1.00")])
    short = create_engine(db_url, connect_args={"options": "-c statement_timeout=400"})
    holder = engine.connect()
    try:
        holder.execute(text(f'LOCK TABLE public."{p.table}" IN SHARE MODE'))
        holder_pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
        threading.Timer(2.5, holder.rollback).start()
        follower(short, p, db_url, 6.0)
    finally:
        holder.close()
        short.dispose()
    assert len(target(engine, p)) == 2  # committed once the user's transaction ended
    lines = [r.getMessage() for r in caplog.records]
    assert any(f"(SQLSTATE 55P03), the lock held by pid {holder_pid}" in line and "ShareLock" in line
               for line in lines), lines
    assert any("outage started: database unavailable (canceling statement due to lock timeout)" in line
               for line in lines), lines
    assert any("outage ended: database back" in line for line in lines), lines


def test_a_commit_waiting_for_a_foreign_keys_parent_row_is_waited_out_and_names_the_holder(engine, db_url,
                                                                                          make_pipe, follower,
                                                                                          caplog):
    """An application holds the parent row a foreign key of the target checks FOR UPDATE: no lock on the target
    itself, the wait is for a row of another table (the error's context names it): an outage, logged with the
    sessions that may hold that row, committed after."""
    p = make_pipe(mode="append")
    first = staged_batch(engine, p, {0: (0, 1)}, good=[(0, 0, "o-0", "1.00")])
    from ledgerbatch.commit.transaction import commit_batch

    commit_batch(engine, p.spec, first.batch_id)
    parent = f"parent_{p.name}"
    with engine.begin() as conn:
        conn.execute(text(f"""CREATE TABLE public."{parent}" (id text PRIMARY KEY);
            INSERT INTO public."{parent}" VALUES ('o-0'), ('o-1');
            ALTER TABLE public."{p.table}" ADD FOREIGN KEY (order_id) REFERENCES public."{parent}" (id)"""))
    staged_batch(engine, p, {0: (1, 2)}, good=[(0, 1, "o-1", "1.00")])
    short = create_engine(db_url, connect_args={"options": "-c statement_timeout=400"})
    app = engine.connect()
    try:
        app.execute(text(f"SELECT * FROM public.\"{parent}\" WHERE id = 'o-1' FOR UPDATE"))
        app_pid = app.execute(text("SELECT pg_backend_pid()")).scalar_one()
        threading.Timer(2.5, app.rollback).start()
        follower(short, p, db_url, 6.0)
    finally:
        app.close()
        short.dispose()
        with engine.begin() as conn:
            conn.execute(text(f'DROP TABLE public."{parent}" CASCADE'))  # the foreign key with it
    assert len(target(engine, p)) == 2
    lines = [r.getMessage() for r in caplog.records]
    assert any(f"the lock held by pid {app_pid}" in line and "RowShareLock" in line for line in lines), lines
    assert any("outage ended: database back" in line for line in lines), lines


def test_a_statement_timeout_on_a_row_lock_wait_is_waited_out(engine):
    """Without the commit's lock_timeout (a statement of its own), a 57014 whose context names the row lock it
    waited for (here a foreign key's parent row an application holds FOR UPDATE) is a lock wait too."""
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS public.fk_child, public.fk_parent; "
                          "CREATE TABLE public.fk_parent (id int PRIMARY KEY); INSERT INTO public.fk_parent VALUES (1); "
                          "CREATE TABLE public.fk_child (id int PRIMARY KEY, parent_id int REFERENCES public.fk_parent)"))
    try:
        with engine.connect() as app:
            app.execute(text("SELECT * FROM public.fk_parent WHERE id = 1 FOR UPDATE"))
            exc = raised(engine, "SET statement_timeout = '300ms'; INSERT INTO public.fk_child VALUES (1, 1)")
            app.rollback()
    finally:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE public.fk_child, public.fk_parent"))
    assert exc.orig.pgcode == "57014" and 'in relation "fk_parent"' in str(exc.orig)
    assert waitable(exc) == DATABASE


def test_a_slow_commit_stops_even_while_a_reader_holds_the_target(engine, db_url, make_pipe, follower):
    """A reader idle in its transaction (a dashboard, pg_dump) holds ACCESS SHARE on the target, which blocks no
    writer: a commit too slow for the statement_timeout is still the operator's, not a lock wait."""
    p = make_pipe(mode="append")
    first = staged_batch(engine, p, {0: (0, 1)}, good=[(0, 0, "o-0", "1.00")])
    from ledgerbatch.commit.transaction import commit_batch

    commit_batch(engine, p.spec, first.batch_id)
    with engine.begin() as conn:
        conn.execute(text(f"""
            CREATE FUNCTION public.slow_{p.name}() RETURNS trigger LANGUAGE plpgsql AS
              $$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$;
            CREATE TRIGGER slow BEFORE INSERT ON public."{p.table}" FOR EACH STATEMENT
              EXECUTE FUNCTION public.slow_{p.name}()"""))
    staged_batch(engine, p, {0: (1, 2)}, good=[(0, 1, "o-1", "1.00")])
    short = create_engine(db_url, connect_args={"options": "-c statement_timeout=400"})
    reader = engine.connect()
    try:
        reader.execute(text(f'SELECT count(*) FROM public."{p.table}"'))
        with pytest.raises(LedgerbatchError, match="statement_timeout") as stopped:
            follower(short, p, db_url, 15.0)
        assert run_module._lock_holders(engine, p.spec) == []  # the reader's lock blocks no writer
    finally:
        reader.close()
        short.dispose()
    assert "SQLSTATE 57014" in str(stopped.value) and "not an outage" in str(stopped.value)


def _refused(_):
    import psycopg2

    psycopg2.connect("host=127.0.0.1 port=1 dbname=x user=postgres connect_timeout=3")  # nothing listens on port 1
    yield 1


def _killed(_, dsn):
    import psycopg2

    with psycopg2.connect(dsn) as conn:
        conn.cursor().execute("SELECT pg_terminate_backend(pg_backend_pid())")
    yield 1


def test_a_staging_tasks_lost_database_is_the_databases_outage_not_a_presumed_sparks(spark, db_url):
    """psycopg2's OperationalError in a Spark task crosses as its traceback's last line, libpq's second one
    (a refused connection's hint, a killed backend's "before or while processing the request."): the
    database's outage, waited out without the same-error limit, not a presumed Spark outage."""
    from ledgerbatch.config import libpq_dsn

    dsn = libpq_dsn(db_url)
    for task in (_refused, lambda part: _killed(part, dsn)):
        with pytest.raises(Exception, match="psycopg2.OperationalError") as caught:
            spark.sparkContext.parallelize([1], 1).mapPartitions(task).collect()
        reason = process.spark_error_reason(caught.value)
        decision = decide(BatchFailedError(f"batch 7 attempt 1 failed: {reason}"))
        assert decision.kind is Kind.OUTAGE and decision.dependency == DATABASE and not decision.presumed, reason

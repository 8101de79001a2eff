"""Least privilege (migrations 003 and 017; docs/operations.md "Database roles"), each right and each refusal
tried for real: executors stage as ledgerbatch_stager, the writer plans, commits and replays, compaction,
purge, offset moves and acknowledged losses need ledgerbatch_admin, the inspector reads the ledger but not
the quarantine's raw bytes."""
from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.model.batch import BatchKind
from ledgerbatch.stage.tables import StagingTables

from . import staged
from .helpers import cli, order_value, produce

pytestmark = pytest.mark.integration

ROLES = {"writer": "ledgerbatch_writer", "inspector": "ledgerbatch_inspector", "admin": "ledgerbatch_admin",
         "stager": "ledgerbatch_stager"}
DENIED = "permission denied|must be owner"


@pytest.fixture(scope="module")
def role_urls(engine, db_url):
    """A login per role (these test logins only; the roles are the migrations')."""
    with engine.begin() as conn:
        for role, group in ROLES.items():
            login = f"lb_test_{role}"
            if not conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": login}).first():
                conn.execute(text(f"CREATE ROLE {login} LOGIN"))
            conn.execute(text(f"GRANT {group} TO {login}"))
        # as operations.md says: the admin login reads and compacts what the writer login owns (its targets)
        conn.execute(text("GRANT lb_test_writer TO lb_test_admin"))
        # Targets live in schemas the writer may create tables in (the hand-staged ones in public).
        conn.execute(text("CREATE SCHEMA IF NOT EXISTS writer_targets"))
        conn.execute(text("GRANT USAGE, CREATE ON SCHEMA writer_targets, public TO ledgerbatch_writer"))
    url = make_url(db_url)
    yield {role: url.set(username=f"lb_test_{role}").render_as_string(hide_password=False) for role in ROLES}


@pytest.fixture
def logins(role_urls):
    engines = {role: create_engine(url) for role, url in role_urls.items()}
    yield engines
    for e in engines.values():
        e.dispose()


def refused(engine, sql: str, params: dict | None = None) -> None:
    with engine.connect() as conn, pytest.raises(ProgrammingError, match=DENIED):
        conn.execute(text(sql), params or {})


def allowed(engine, sql: str, params: dict | None = None) -> int:
    """Runs `sql` and rolls it back; the rows it touched."""
    with engine.connect() as conn:
        n = conn.execute(text(sql), params or {}).rowcount
        conn.rollback()
    return n


def test_pipeline_runs_with_each_role_doing_its_part(engine, role_urls, broker, make_pipeline):
    p = make_pipeline(partitions=2, target={"table": "", "mode": "append"})
    spec_path = p.dir / f"{p.name}.yaml"
    spec_path.write_text(spec_path.read_text().replace("table: ''", f"table: writer_targets.{p.table}"))
    records = [(i % 2, order_value(i)) for i in range(50)] + [(0, b"not json"), (1, b"{broken")]
    assert len(produce(broker.bootstrap_servers, p.topic, records)) == 52

    def as_(role: str, *args: str):
        return cli(list(args), role_urls[role], broker.bootstrap_servers, p.dir,
                   LEDGERBATCH_STAGING_DB_URL=role_urls["stager"])

    done = as_("writer", "run", p.name)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "LEDGERBATCH_STAGING_DB_URL is not set" not in done.stderr
    with engine.connect() as conn:
        assert conn.execute(text(f'SELECT count(*) FROM writer_targets."{p.table}"')).scalar_one() == 50
        assert conn.execute(text("SELECT count(*) FROM ledger.quarantine WHERE pipeline = :p"), {"p": p.name}).scalar_one() == 2
        # the committed batch's partition keeps none of the executors' grants
        partitions = conn.execute(text("SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = "
                                       "CAST(:t AS regclass)"), {"t": f'writer_targets."{p.table}"'}).scalars().all()
        assert partitions
        for part in partitions:
            assert not conn.execute(text("SELECT has_table_privilege('lb_test_stager', :t, 'INSERT') "
                                         "OR has_table_privilege('lb_test_stager', :t, 'DELETE')"), {"t": part}).scalar_one()

    # A replay replaces what the first delivery quarantined: the writer may delete exactly those records.
    replayed = as_("writer", "replay", p.name, "--from-offset", "0", "--until-offset", "26")
    assert replayed.returncode == 0, replayed.stderr[-2000:]
    with engine.connect() as conn:
        bad = conn.execute(text("SELECT count(DISTINCT batch_id), count(*) FROM ledger.quarantine WHERE pipeline = :p"),
                           {"p": p.name}).one()
    assert tuple(bad) == (1, 2)  # both bad records now belong to the replay

    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(50, 54)])  # for offsets --set to skip
    for args in (("compact", p.name, "--before", "0m"), ("quarantine", "purge", p.name, "--before", "0m"),
                 ("offsets", p.name, "--set", "--to-latest", "--by", "alice", "--reason", "r")):
        out = as_("writer", *args)
        assert out.returncode != 0 and "ledgerbatch_admin" in out.stderr, (args, out.stderr[-2000:])
        out = as_("admin", *args)
        assert out.returncode == 0, (args, out.stderr[-2000:])
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ledger.batches WHERE pipeline = :p"), {"p": p.name}).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM ledger.quarantine WHERE pipeline = :p"), {"p": p.name}).scalar_one() == 0
    out = as_("admin", "verify", p.name)  # the skipped offsets tile the log as the moved cursor says
    assert out.returncode == 0, out.stderr[-2000:]
    out = as_("inspector", "status", p.name)
    assert out.returncode == 0 and p.topic in out.stdout, out.stderr[-2000:]


@pytest.fixture
def committed(logins):
    """A batch committed by the writer with a bad record, and a replay of it staged (not committed)."""
    p = staged.Pipe(Path(tempfile.mkdtemp(prefix="lb_privileges_")))
    writer = logins["writer"]
    s1 = staged.staged_batch(writer, p, {0: (0, 3)}, good=[(0, 0, "o-1", "5.00"), (0, 1, "o-2", "7.00")],
                             bad=[(0, 2, "value is not valid JSON: card 4111111111111111")])
    commit_batch(writer, p.spec, s1.batch_id)
    replay = staged.staged_batch(writer, p, {0: (0, 3)}, good=[(0, 0, "o-1", "5.00"), (0, 1, "o-2", "7.00")],
                                 bad=[(0, 2, "value is not valid JSON: card 4111111111111111")], kind=BatchKind.REPLAY)
    return p, s1.batch_id, replay


def test_writer_commits_and_cannot_rewrite_history(logins, committed):
    p, batch_id, replay = committed
    writer, q = logins["writer"], {"p": p.name, "b": batch_id}
    # its rights: plan, attempt, advance a cursor, forget staged reads, delete what a staged replay replaces
    assert allowed(writer, "INSERT INTO ledger.batches (pipeline, kind) VALUES (:p, 'backfill')", q) == 1
    assert allowed(writer, "UPDATE ledger.cursors SET next_offset = next_offset, updated_at = now() WHERE pipeline = :p", q) == 1
    assert allowed(writer, "UPDATE ledger.batches SET spec_version = spec_version WHERE batch_id = :b", q) == 1
    assert allowed(writer, "DELETE FROM ledger.staged_reads WHERE batch_id = :b", q) == 0
    assert allowed(writer, "DELETE FROM ledger.quarantine WHERE pipeline = :p", q) == 1  # the replay is staged
    assert allowed(writer, "INSERT INTO ledger.pauses (pipeline, paused_by, reason) VALUES (:p, 'me', 'r')", q) == 1
    # its refusals: committed history, compaction, purge, offset moves, acknowledged losses
    for sql in ("DELETE FROM ledger.batches WHERE batch_id = :b",
                "DELETE FROM ledger.batch_ranges WHERE batch_id = :b",
                "UPDATE ledger.batches SET rows_written = 0 WHERE batch_id = :b",
                "UPDATE ledger.batches SET status = 'abandoned' WHERE batch_id = :b",
                "UPDATE ledger.batch_ranges SET records_read = 0 WHERE batch_id = :b",
                "INSERT INTO ledger.batches (pipeline, kind, status, committed_at, staging_table, records_read, "
                "rows_written, rows_quarantined) VALUES (:p, 'live', 'committed', now(), 'x', 0, 0, 0)",
                "UPDATE ledger.cursors SET start_offset = 0 WHERE pipeline = :p",
                "INSERT INTO ledger.lost_ranges (pipeline, topic, partition, from_offset, until_offset, acknowledged_by) "
                "VALUES (:p, 't', 0, 0, 5, 'alice')",
                "DELETE FROM ledger.lost_ranges", "UPDATE ledger.lost_ranges SET until_offset = 1",
                "INSERT INTO ledger.offset_moves (pipeline, topic, partition, to_offset, moved_by, reason, request) "
                "VALUES (:p, 't', 0, 0, 'me', 'r', 'x')",
                "INSERT INTO ledger.checkpoints (pipeline, topic, partition, from_offset, until_offset, records_read, ranges) "
                "VALUES (:p, 't', 0, 0, 0, 0, 0)",
                "UPDATE ledger.compactions SET batches = 0", "DELETE FROM ledger.checkpoints",
                "DELETE FROM ledger.spec_versions", "TRUNCATE ledger.quarantine",
                "INSERT INTO ledger.schema_migrations (version, name) VALUES (999, 'x')",
                "DROP TABLE ledger.batches", "ALTER TABLE ledger.batches DISABLE TRIGGER batches_keep_history",
                "CREATE TABLE ledger.x (a int)"):
        refused(writer, sql, q)
    # a quarantined record no staged replay replaces: the replay is gone (abandoned), so is the right
    with writer.begin() as conn:
        conn.execute(text("UPDATE ledger.batches SET status = 'abandoned' WHERE batch_id = :r"), {"r": replay.batch_id})
    refused(writer, "DELETE FROM ledger.quarantine WHERE pipeline = :p", q)


def test_admin_compacts_purges_and_moves_offsets(logins, committed):
    p, batch_id, _ = committed
    admin, q = logins["admin"], {"p": p.name, "b": batch_id}
    for sql in ("DELETE FROM ledger.quarantine WHERE pipeline = :p",
                "UPDATE ledger.batches SET rows_written = rows_written WHERE batch_id = :b",
                "UPDATE ledger.cursors SET start_offset = start_offset WHERE pipeline = :p",
                "INSERT INTO ledger.lost_ranges (pipeline, topic, partition, from_offset, until_offset, acknowledged_by) "
                "VALUES (:p, 't', 0, 0, 5, 'alice')",
                "INSERT INTO ledger.offset_moves (pipeline, topic, partition, to_offset, moved_by, reason, request) "
                "VALUES (:p, 't', 0, 0, 'me', 'r', 'x')",
                "INSERT INTO ledger.checkpoints (pipeline, topic, partition, from_offset, until_offset, records_read, ranges) "
                "VALUES (:p, 't', 0, 0, 0, 0, 0)",
                "DELETE FROM ledger.batch_ranges WHERE batch_id = :b"):
        assert allowed(admin, sql, q) >= 1, sql
    for sql in ("DROP TABLE ledger.batches", "TRUNCATE ledger.batches CASCADE", "CREATE TABLE ledger.x (a int)",
                "INSERT INTO ledger.schema_migrations (version, name) VALUES (999, 'x')"):
        refused(admin, sql, q)


def test_inspector_reads_the_ledger_but_not_raw_records(logins, committed):
    p, batch_id, _ = committed
    inspector, q = logins["inspector"], {"p": p.name, "b": batch_id}
    with inspector.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ledger.batches WHERE pipeline = :p"), q).scalar_one() == 2
        assert conn.execute(text("SELECT count(*) FROM ledger.recent_batches")).scalar_one() >= 2
        assert conn.execute(text('SELECT "offset", error, sqlstate FROM ledger.quarantine WHERE pipeline = :p'), q).all()
        assert conn.execute(text("SELECT records FROM ledger.quarantine_summary WHERE pipeline = :p"), q).scalar_one() == 1
    for sql in ("SELECT value FROM ledger.quarantine", "SELECT key FROM ledger.quarantine",
                "SELECT error_detail FROM ledger.quarantine",
                "SELECT * FROM ledger.quarantine", f'SELECT * FROM public."{p.table}"',
                "UPDATE ledger.cursors SET next_offset = 0", "DELETE FROM ledger.batches",
                "INSERT INTO ledger.lost_ranges (pipeline, topic, partition, from_offset, until_offset, acknowledged_by) "
                "VALUES ('x', 't', 0, 0, 1, 'me')",
                "CREATE TABLE ledger_staging.evil (x int)", "DROP TABLE ledger.quarantine"):
        refused(inspector, sql, q)


def test_stager_copies_into_staging_and_nothing_else(logins, committed):
    p, batch_id, _ = committed
    stager, writer = logins["stager"], logins["writer"]
    s = staged.begin(writer, p, staged.plan(writer, p, {0: (3, 5)}))  # the driver (writer) creates and grants
    tables = StagingTables(s.staging)
    rows = {"b": s.batch_id, "a": s.attempt, "t": p.topic}
    with contextlib.closing(stager.raw_connection()) as raw:
        cur = raw.cursor()
        cur.execute(f'DELETE FROM ledger_staging."{tables.name}" WHERE _topic = %s AND _partition = 0', (p.topic,))
        cur.copy_expert(f'COPY ledger_staging."{tables.name}" (order_id, customer, amount, ts, _topic, _partition, '
                        f'_offset, _batch_id) FROM STDIN WITH (FORMAT csv)',
                        io.StringIO(f"o-3,c,1.00,2026-11-21T10:00:00Z,{p.topic},0,3,{s.batch_id}\n"))
        cur.copy_expert(f'COPY ledger_staging."{tables.bad}" (_topic, _partition, _offset, _error, _key, _value) '
                        f'FROM STDIN WITH (FORMAT csv)', io.StringIO(f"{p.topic},0,4,bad,,\\x00\n"))
        cur.execute("INSERT INTO ledger.staged_reads (batch_id, attempt, topic, partition, records, bad) "
                    "VALUES (%s, %s, %s, 0, 2, 1) ON CONFLICT (batch_id, attempt, topic, partition) "
                    "DO UPDATE SET records = EXCLUDED.records, bad = EXCLUDED.bad", (s.batch_id, s.attempt, p.topic))
        raw.rollback()
    for sql in (f'SELECT * FROM ledger_staging."{tables.name}"', f'SELECT _value FROM ledger_staging."{tables.bad}"',
                f'DROP TABLE ledger_staging."{tables.name}"', "CREATE TABLE ledger_staging.evil (x int)",
                "SELECT count(*) FROM ledger.batches", "SELECT count(*) FROM ledger.quarantine",
                "UPDATE ledger.batches SET status = 'failed' WHERE batch_id = :b",
                "INSERT INTO ledger.batches (pipeline, kind) VALUES (:t, 'live')",
                "UPDATE ledger.staged_reads SET batch_id = 1", "DELETE FROM ledger.staged_reads",
                "UPDATE ledger.cursors SET next_offset = 0", "DELETE FROM ledger.lost_ranges",
                f'INSERT INTO public."{p.table}" (order_id) VALUES (\'x\')'):
        refused(stager, sql, rows)

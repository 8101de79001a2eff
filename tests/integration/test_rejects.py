"""Rows the target refuses at publish (commit/rejects.py), on batches staged by hand (staged.py): each kind
of refusal the server has is quarantined with its SQLSTATE and constraint, on the copy and the attach path
of an append target, for upserts and for deletes; errors that are the server's state, not a row's, fail
the batch and leave nothing quarantined, and the next commit delivers."""
from __future__ import annotations

import json
import random
import string
from types import SimpleNamespace as Namespace

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledgerbatch.commit.modes.catalog import mode_for
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.model.batch import BatchStatus
from ledgerbatch.ops.verify import verify

from .helpers import assert_exactly_once, cli, produce
from .staged import batch, cursors, quarantine, refused, staged_batch, target, target_shape

pytestmark = pytest.mark.integration

GOOD = [(0, 0, "o-0", "1.00"), (0, 1, "o-1", "2.00"), (0, 2, "o-2", "3.00"), (0, 3, "o-3", "4.00")]
# 4,000 characters that compression cannot shrink below the btree maximum
LONG_KEY = "".join(random.Random(7).choices(string.ascii_letters + string.digits, k=4000))


def tighten(engine, p, *statements: str) -> None:
    """Create the target, then change it as a user would; `{t}` is the target table."""
    with engine.begin() as conn:
        mode_for(p.spec).ensure_target(conn, p.spec, target_shape(p))
        for sql in statements:
            conn.execute(text(sql.format(t=f'public."{p.table}"', name=p.table)))


# (what the user did to the target, rows staged besides GOOD, SQLSTATE, the constraint's name: None when the
# server names none, True when it is an index PostgreSQL named)
REFUSALS = {
    "check": (["ALTER TABLE {t} ADD CONSTRAINT positive CHECK (amount > 0)"],
              [(0, 4, "o-4", "-1.00")], "23514", "positive"),
    "foreign key": (["CREATE TABLE public.{name}_orders (order_id text PRIMARY KEY)",
                     "INSERT INTO public.{name}_orders SELECT 'o-' || i FROM generate_series(0, 3) i",
                     "ALTER TABLE {t} ADD CONSTRAINT known_order FOREIGN KEY (order_id) REFERENCES public.{name}_orders"],
                    [(0, 4, "o-99", "5.00")], "23503", "known_order"),
    "varchar(5)": (["ALTER TABLE {t} ALTER COLUMN order_id TYPE varchar(5)"],
                   [(0, 4, "o-123456", "5.00")], "22001", None),
    "not null": (["ALTER TABLE {t} ALTER COLUMN amount SET NOT NULL"],
                 [(0, 4, "o-4", None)], "23502", None),
    "trigger": (["CREATE FUNCTION public.{name}_no_7() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "IF NEW.order_id = 'o-7' THEN RAISE EXCEPTION 'order o-7 is embargoed'; END IF; RETURN NEW; END $$",
                 "CREATE TRIGGER no_7 BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION public.{name}_no_7()"],
                [(0, 4, "o-7", "5.00")], "P0001", None),
    "unique index": (["CREATE UNIQUE INDEX {name}_one_per_amount ON {t} (amount, _batch_id)"],
                     [(0, 4, "o-4", "2.00")], "23505", True),
    "check added NOT VALID": (["ALTER TABLE {t} ADD CONSTRAINT positive CHECK (amount > 0) NOT VALID"],
                              [(0, 4, "o-4", "-1.00")], "23514", "positive"),
    "trigger's own SQLSTATE": (["CREATE FUNCTION public.{name}_no_7() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                                "IF NEW.order_id = 'o-7' THEN RAISE EXCEPTION 'order o-7 is embargoed' "
                                "USING ERRCODE = 'LB001'; END IF; RETURN NEW; END $$",
                                "CREATE TRIGGER no_7 BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION public.{name}_no_7()"],
                               [(0, 4, "o-7", "5.00")], "LB001", None),
    "trigger's ASSERT": (["CREATE FUNCTION public.{name}_no_7() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                          "ASSERT NEW.order_id <> 'o-7', 'order o-7 is embargoed'; RETURN NEW; END $$",
                          "CREATE TRIGGER no_7 BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION public.{name}_no_7()"],
                         [(0, 4, "o-7", "5.00")], "P0004", None),
    # a key longer than a btree index entry may be (about 2.7 KB): "index row size ... exceeds btree maximum"
    "key too long for an index": (["CREATE INDEX {name}_by_order ON {t} (order_id)"],
                                  [(0, 4, LONG_KEY, "5.00")], "54000", "{name}_by_order"),
}


@pytest.mark.parametrize("attach", [False, True], ids=["copied", "attached"])
@pytest.mark.parametrize("kind", list(REFUSALS))
def test_each_refusal_is_quarantined_with_its_reason(engine, make_pipe, monkeypatch, kind, attach):
    """Append: the refused row (the fifth, or the second of two rows with one amount) is quarantined, the
    rest published; attached as a partition when the batch is big (here: always), copied otherwise."""
    monkeypatch.setattr("ledgerbatch.commit.modes.partitions.ATTACH_MIN_ROWS", 1 if attach else 10**9)
    statements, bad_rows, sqlstate, constraint = REFUSALS[kind]
    p = make_pipe(max_ratio=0.9)
    tighten(engine, p, *statements)
    s = staged_batch(engine, p, {0: (0, 5)}, good=GOOD + bad_rows)
    result = commit_batch(engine, p.spec, s.batch_id)

    assert (result.rows_written, result.rows_rejected) == (4, 1)
    assert [r[:3] for r in target(engine, p)] == [(0, 0, "o-0"), (0, 1, "o-1"), (0, 2, "o-2"), (0, 3, "o-3")]
    got = refused(engine, p)
    assert [r[:4] for r in got] == [(0, 4, s.batch_id, sqlstate)]
    if constraint is True:  # an index PostgreSQL named
        assert "amount" in got[0][4]
    else:
        assert got[0][4] == (constraint and constraint.format(name=p.table))
    error = quarantine(engine, p)[0][3]
    assert "refused by the target: " in error and bad_rows[0][2] not in error.replace("order o-7 is", "")
    with engine.connect() as conn:  # the server's detail holds the row's values: apart, where the inspector cannot read
        detail = conn.execute(text("SELECT error_detail FROM ledger.quarantine WHERE pipeline = :p"),
                              {"p": p.name}).scalar_one()
    if kind in ("check", "not null", "check added NOT VALID"):
        assert detail.startswith("Failing row contains (") and bad_rows[0][2] in detail
    elif kind in ("foreign key", "unique index"):
        assert detail.startswith("Key (")
    with engine.connect() as conn:
        ranges = conn.execute(text("SELECT records_read, records_rejected FROM ledger.batch_ranges WHERE batch_id = :b"),
                              {"b": s.batch_id}).all()
    assert [tuple(r) for r in ranges] == [(5, 1)]
    assert verify(engine, p.spec) == []


def test_many_refused_rows_among_many(engine, make_pipe):
    """1% of 2,000 rows break one of three constraints: exactly they are quarantined, by constraint."""
    p = make_pipe(max_ratio=0.5)
    tighten(engine, p, "ALTER TABLE {t} ADD CONSTRAINT positive CHECK (amount > 0)",
            "ALTER TABLE {t} ALTER COLUMN order_id TYPE varchar(8)",
            "CREATE UNIQUE INDEX {name}_by_order ON {t} (order_id, _batch_id)")
    rows, expected = [], {}
    for i in range(2000):
        oid, amount = f"o-{i}", "1.00"
        if i % 100 == 17:
            amount, expected[i] = "-5.00", "23514"
        elif i % 100 == 53:
            oid, expected[i] = f"o-long-{i}", "22001"
        elif i % 100 == 71:
            oid, expected[i] = "o-0", "23505"  # o-0 is the first row's: this one is the duplicate
        rows.append((0, i, oid, amount))
    s = staged_batch(engine, p, {0: (0, 2000)}, good=rows)
    result = commit_batch(engine, p.spec, s.batch_id)
    assert result.rows_rejected == len(expected) == 60
    assert {r[1]: r[3] for r in refused(engine, p)} == expected
    assert len(target(engine, p)) == 2000 - 60
    assert verify(engine, p.spec) == []


def test_upsert_a_refused_newest_change_leaves_the_newest_accepted_one(engine, make_pipe):
    """Upsert: the key's last change is refused, so its change before that one in the batch wins."""
    p = make_pipe(mode="upsert", max_ratio=0.9)
    tighten(engine, p, "ALTER TABLE {t} ADD CONSTRAINT positive CHECK (amount > 0)")
    s = staged_batch(engine, p, {0: (0, 4)}, good=[(0, 0, "o-1", "1.00"), (0, 1, "o-1", "2.00"),
                                                   (0, 2, "o-2", "3.00"), (0, 3, "o-1", "-1.00")])
    assert commit_batch(engine, p.spec, s.batch_id).rows_rejected == 1
    assert [r[:4] for r in target(engine, p)] == [(0, 1, "o-1", "2.00"), (0, 2, "o-2", "3.00")]
    assert [r[:4] for r in refused(engine, p)] == [(0, 3, s.batch_id, "23514")]
    assert verify(engine, p.spec) == []


def test_a_refused_delete_is_quarantined_and_the_row_stays(engine, make_pipe):
    """Change pipelines: a delete the target refuses (another table still references the row) is quarantined;
    the batch's other changes apply."""
    p = make_pipe(mode="upsert", deletes=True, max_ratio=0.9)
    first = staged_batch(engine, p, {0: (0, 2)}, good=[(0, 0, "o-0", "1.00"), (0, 1, "o-1", "2.00")])
    commit_batch(engine, p.spec, first.batch_id)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE TABLE public."{p.table}_lines" (order_id text REFERENCES public."{p.table}" (order_id))'))
        conn.execute(text(f"INSERT INTO public.\"{p.table}_lines\" VALUES ('o-1')"))
    s = staged_batch(engine, p, {0: (2, 4)}, good=[(0, 2, "o-0", None), (0, 3, "o-1", None)])  # two deletes
    result = commit_batch(engine, p.spec, s.batch_id)
    assert result.rows_rejected == 1
    assert [r[:3] for r in target(engine, p)] == [(0, 1, "o-1")]
    assert [r[:5] for r in refused(engine, p)] == [(0, 3, s.batch_id, "23503", f"{p.table}_lines_order_id_fkey")]
    b = batch(engine, s.batch_id)
    assert (b.records_read, b.rows_written, b.rows_deleted, b.rows_rejected) == (2, 0, 1, 1)
    assert verify(engine, p.spec) == []


# Errors that say the server is unwell, not the row: raised from a trigger with their SQLSTATE where they
# cannot be caused on demand (serialization failure, deadlock, disk full), caused for real otherwise.
UNWELL = {
    "serialization failure": "RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001'",
    "deadlock": "RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'",
    "disk full": "RAISE EXCEPTION 'could not extend file' USING ERRCODE = '53100'",
    "lock timeout": "SET LOCAL lock_timeout = '50ms'; LOCK TABLE public.{name}_held",
    "terminated backend": "PERFORM pg_terminate_backend(pg_backend_pid())",
}


@pytest.mark.parametrize("kind", list(UNWELL))
def test_errors_of_the_server_fail_the_batch_and_the_next_commit_delivers(engine, make_pipe, kind):
    p = make_pipe(max_ratio=0.9)
    tighten(engine, p, "CREATE TABLE public.{name}_held (x int)",
            "CREATE FUNCTION public.{name}_unwell() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            + UNWELL[kind].format(name=p.table) + "; RETURN NEW; END $$",
            "CREATE TRIGGER unwell BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION public.{name}_unwell()")
    s = staged_batch(engine, p, {0: (0, 4)}, good=GOOD)
    holder = engine.connect()
    try:
        holder.execute(text(f'LOCK TABLE public."{p.table}_held"'))  # for the lock timeout
        with pytest.raises(DBAPIError):
            commit_batch(engine, p.spec, s.batch_id)
    finally:
        holder.rollback()
        holder.close()
    assert quarantine(engine, p) == [] and cursors(engine, p) == {0: 0}
    assert batch(engine, s.batch_id).status == BatchStatus.STAGED

    with engine.begin() as conn:
        conn.execute(text(f'DROP TRIGGER unwell ON public."{p.table}"'))
    assert commit_batch(engine, p.spec, s.batch_id).rows_written == 4
    assert len(target(engine, p)) == 4 and quarantine(engine, p) == []


def test_a_revoked_privilege_fails_the_batch(engine, db_url, make_pipe):
    """The committing login may no longer insert into the target: 42501, never a quarantine."""
    from sqlalchemy.engine import make_url

    from ledgerbatch.ledger.engine import make_engine

    p = make_pipe()
    commit_batch(engine, p.spec, staged_batch(engine, p, {0: (0, 4)}, good=GOOD).batch_id)
    with engine.begin() as conn:
        if conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = 'lb_reject_writer'")).first():
            conn.execute(text("DROP OWNED BY lb_reject_writer; DROP ROLE lb_reject_writer"))
        conn.execute(text("CREATE ROLE lb_reject_writer LOGIN IN ROLE ledgerbatch_writer"))
        conn.execute(text("GRANT USAGE, CREATE ON SCHEMA public TO lb_reject_writer"))
        conn.execute(text(f'GRANT SELECT, INSERT ON public."{p.table}" TO lb_reject_writer'))
        conn.execute(text(f'REVOKE INSERT ON public."{p.table}" FROM lb_reject_writer'))
    writer = make_engine(make_url(db_url).set(username="lb_reject_writer").render_as_string(hide_password=False))
    try:
        s = staged_batch(writer, p, {0: (4, 5)}, good=[(0, 4, "o-4", "5.00")])
        with pytest.raises(DBAPIError, match="permission denied"):
            commit_batch(writer, p.spec, s.batch_id)
        assert quarantine(engine, p) == [] and cursors(engine, p) == {0: 4}
        with engine.begin() as conn:
            conn.execute(text(f'GRANT INSERT ON public."{p.table}" TO lb_reject_writer'))
        assert commit_batch(writer, p.spec, s.batch_id).rows_written == 1
    finally:
        writer.dispose()
    assert len(target(engine, p)) == 5 and quarantine(engine, p) == []


# -- end to end: Kafka, `ledgerbatch run` SIGKILLed at every crash point, a target that refuses about 1% of rows

CRASH_POINTS = ("after_plan", "mid_read", "after_stage", "before_commit", "after_commit")


def _order(i: int) -> bytes:
    """Order i, unique by order id and by ts; every 100 records one breaks each of the target's rules."""
    oid, customer, amount, second = f"o-{i}", f"c-{i % 7}", "1.00", i
    if i % 100 == 13:
        oid = f"o-too-long-{i}"  # varchar(10)
    elif i % 100 == 29:
        amount = "-1.00"  # CHECK (amount > 0)
    elif i % 100 == 47:
        customer = "c-unknown"  # FOREIGN KEY (customer)
    elif i % 100 == 71:
        second = i - 1  # the unique index on ts: record i-1's ts
    return json.dumps({"order_id": oid, "customer": customer, "amount": amount,
                       "ts": f"2026-11-21T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}Z"}).encode()


EXPECTED_SQLSTATE = {13: "22001", 29: "23514", 47: "23503", 71: "23505"}


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_refused_rows_through_sigkills_at_every_crash_point(engine, db_url, broker, make_pipeline, mode):
    target = {"table": "", "mode": mode} | ({"key": ["order_id"]} if mode == "upsert" else {})
    p = make_pipeline(partitions=3, batch__max_records=400, target=target)
    spec_file = p.dir / f"{p.name}.yaml"
    spec_file.write_text(spec_file.read_text().replace("table: ''", f"table: public.{p.table}"))
    unique_ts = "(ts)" if mode == "upsert" else "(ts, _batch_id)"  # a partitioned index includes the batch id
    tighten(engine, Namespace(spec=p.spec, table=p.table),
            "CREATE TABLE public.{name}_customers (customer text PRIMARY KEY)",
            "INSERT INTO public.{name}_customers SELECT 'c-' || i FROM generate_series(0, 6) i",
            "ALTER TABLE {t} ALTER COLUMN order_id TYPE varchar(10)",
            "ALTER TABLE {t} ADD CONSTRAINT positive CHECK (amount > 0)",
            "ALTER TABLE {t} ADD CONSTRAINT known_customer FOREIGN KEY (customer) REFERENCES public.{name}_customers",
            f"CREATE UNIQUE INDEX {{name}}_one_per_ts ON {{t}} {unique_ts}")
    n = 1500
    orders = {_order(i): i for i in range(n)}
    acked = produce(broker.bootstrap_servers, p.topic, [(i % 3, value) for value, i in orders.items()])
    coordinate = {orders[value]: (partition, offset) for partition, offset, value in acked}

    for point in CRASH_POINTS:  # each run is killed at the first time it reaches the point
        crashed = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir, LEDGERBATCH_CRASH_AT=point)
        assert crashed.returncode == -9, crashed.stderr[-2000:]
    done = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert done.returncode == 0, done.stderr[-2000:]

    with engine.connect() as conn:
        refused_rows = {(r.partition, r.offset): r.sqlstate for r in conn.execute(text(
            'SELECT partition, "offset", sqlstate FROM ledger.quarantine WHERE pipeline = :p'), {"p": p.name})}
    by_index = {i: refused_rows.get(c) for i, c in coordinate.items()}
    for i, sqlstate in by_index.items():
        if i % 100 in (13, 29, 47):
            assert sqlstate == EXPECTED_SQLSTATE[i % 100], (i, sqlstate)
        elif i % 100 not in (70, 71):
            assert sqlstate is None, (i, sqlstate)
    pairs = [(by_index[i - 1], by_index[i]) for i in range(n) if i % 100 == 71]
    # one of each pair of equal ts is refused where the index sees both (always, when it is global)
    assert all(sorted(map(str, pair)) == ["23505", "None"] for pair in pairs) if mode == "upsert" else \
        all(None in pair for pair in pairs)
    refused_set = {c for c, _ in refused_rows.items()}
    assert_exactly_once(engine, p, broker.bootstrap_servers, set(coordinate.values()) - refused_set, refused_set)
    assert verify(engine, p.spec) == []
    with engine.connect() as conn:
        rejected = conn.execute(text("SELECT sum(rows_rejected) FROM ledger.batches WHERE pipeline = :p AND "
                                     "status = 'committed'"), {"p": p.name}).scalar_one()
    assert rejected == len(refused_rows) >= 45


def test_on_reject_fail_stops_the_run_loudly_with_nothing_written(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=1, errors={"policy": "quarantine", "max_ratio": 0.5, "on_reject": "fail"})
    tighten(engine, Namespace(spec=p.spec, table=p.table), "ALTER TABLE {t} ADD CONSTRAINT positive CHECK (amount > 0)")
    produce(broker.bootstrap_servers, p.topic, [(0, _order(i)) for i in range(20, 40)])  # 29: amount -1.00
    failed = cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert failed.returncode == 1, failed.stderr[-3000:]
    with engine.connect() as conn:
        batch_ids = conn.execute(text("SELECT batch_id FROM ledger.batches WHERE pipeline = :p"), {"p": p.name}).scalars().all()
    assert len(batch_ids) == 1, failed.stderr[-3000:]  # a run that failed before planning says why
    batch_id = batch_ids[0]
    assert (f"the target refused 1 of 20 rows, the first {p.topic}[0] offset 9: new row for relation "
            f'"{p.table}_b{batch_id}" violates check constraint "positive" (SQLSTATE 23514') in failed.stderr
    assert "o-29" not in failed.stderr  # the row's values (the server's detail) stay out of errors and logs
    assert "(SQLSTATE 23514, constraint positive); errors.on_reject is fail, so nothing was written" in failed.stderr
    with engine.connect() as conn:
        assert conn.execute(text(f'SELECT count(*) FROM public."{p.table}"')).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM ledger.quarantine WHERE pipeline = :p"), {"p": p.name}).scalar_one() == 0
        assert conn.execute(text("SELECT status FROM ledger.batches WHERE pipeline = :p"), {"p": p.name}).scalar_one() == "staged"

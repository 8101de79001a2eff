"""A partition rollup online (issue #49): commits do not wait for its copy, only for its brief swap; a replay
racing it gives the serial result; a reader's snapshot never loses rows to it (the rollup waits for older
snapshots, then gives way). Batches of many rows are made in SQL, as the executors' COPY would leave them."""
from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from ledgerbatch.commit.modes import rollup
from ledgerbatch.commit.modes.append import partitions_of
from ledgerbatch.commit.modes.rollup import roll_up
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.ledger.batches import get_batch, mark_staged
from ledgerbatch.model.batch import BatchKind
from ledgerbatch.ops import upkeep_failures
from ledgerbatch.ops.verify import verify

from .staged import begin, plan, respec, staged_batch

pytestmark = pytest.mark.integration


def over_the_bound(engine, make_pipe, rows: int):
    """Three attached batches of `rows` rows each (offsets 0 ..) under a bound of 2: a rollup merges the first two."""
    p = make_pipe(max_ratio=0.9)
    respec(p, target={"partitions": {"max": 2, "attach_min_rows": 1}})
    for lo in range(0, 3 * rows, rows):
        s = begin(engine, p, plan(engine, p, {0: (lo, lo + rows)}))
        with engine.begin() as conn:
            conn.execute(text(f'INSERT INTO ledger_staging."{s.staging}" (order_id, customer, amount, ts, _topic, '
                              "_partition, _offset, _batch_id) SELECT 'o-' || g, 'c', 1.00, now(), :topic, 0, g, :b "
                              "FROM generate_series(:lo, :hi - 1) g"),
                         {"topic": p.topic, "b": s.batch_id, "lo": lo, "hi": lo + rows})
            mark_staged(conn, s.batch_id, s.attempt, s.staging, get_batch(conn, s.batch_id).ranges,
                        {(p.topic, 0): (rows, 0)})
        commit_batch(engine, p.spec, s.batch_id)
    assert n_partitions(engine, p) == 3
    return p


def n_partitions(engine, p) -> int:
    with engine.connect() as conn:
        return len(partitions_of(conn, p.spec))


def small_batch(engine, p, lo: int, hi: int, kind=BatchKind.LIVE, amount="1.00"):
    return staged_batch(engine, p, {0: (lo, hi)}, good=[(0, o, f"o-{o}", amount) for o in range(lo, hi)], kind=kind)


COPY_S = 15.0  # a copy that takes this long, whatever the machine's load: waits are judged against it


def slow_copies(monkeypatch) -> None:
    """Each partition's copy first sleeps COPY_S (in the copy's statement, so a cancel ends it as it would the copy)."""
    original = rollup.query

    def slow(name, **identifiers):
        sql = original(name, **identifiers)
        return sql.replace(" FROM ", f" FROM pg_sleep({COPY_S}) AS pause, ", 1) if name == "copy_partition" else sql
    monkeypatch.setattr(rollup, "query", slow)


class RollupInThread:
    """roll_up in a thread of its own; `copying()` waits until its copy runs."""

    def __init__(self, engine, p):
        self.engine, self.result, self.seconds = engine, None, None

        def go():
            started = time.monotonic()
            self.result = roll_up(engine, p.spec)
            self.seconds = time.monotonic() - started
        self.thread = threading.Thread(target=go)
        self.thread.start()

    def copying(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        with self.engine.connect() as conn:
            while not conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                                        "AND query LIKE 'INSERT INTO %lb_rollup_%'")).scalar_one():
                assert time.monotonic() < deadline, "the rollup's copy never started"
                conn.rollback()  # pg_stat_activity is read once per transaction
                time.sleep(0.005)

    def join(self):
        self.thread.join(120)
        assert not self.thread.is_alive()
        return self.result


def counts(engine, p, replay_batch: int | None = None) -> tuple[int, int, int]:
    """Rows, distinct offsets, and rows of offsets [0, 10) the replay wrote with its amount."""
    with engine.connect() as conn:
        return tuple(conn.execute(text(
            f'SELECT count(*), count(DISTINCT _offset), count(*) FILTER (WHERE _offset < 10 AND _batch_id = :b '
            f"AND amount = 2.00) FROM public.\"{p.table}\""), {"b": replay_batch or -1}).one())


def test_a_commit_waits_for_the_swap_not_for_a_big_rollups_copy(engine, make_pipe, monkeypatch):
    rows = 1_000
    p = over_the_bound(engine, make_pipe, rows)
    live = small_batch(engine, p, 3 * rows, 3 * rows + 10)
    slow_copies(monkeypatch)
    rolling = RollupInThread(engine, p)
    rolling.copying()
    started = time.monotonic()
    commit_batch(engine, p.spec, live.batch_id)  # the next live batch, committed by another runner
    commit_wait = time.monotonic() - started
    merged = rolling.join()
    assert merged is not None and len(merged.merged) == 2
    # the copy takes COPY_S at least; the 10-row commit a tenth of a second or so, seconds on a loaded machine
    assert rolling.seconds >= COPY_S and commit_wait < COPY_S / 3, (commit_wait, rolling.seconds)
    # the live batch was attached (attach_min_rows 1): closing the open partition did not wait for the copy either
    assert n_partitions(engine, p) == 3
    assert counts(engine, p) == (3 * rows + 10, 3 * rows + 10, 0)
    assert verify(engine, p.spec) == []


def test_a_replay_racing_a_rollup_gives_the_serial_result(engine, make_pipe):
    """The replay replaces rows of a partition being merged: it waits for the copy (the rollup holds the merged
    partitions until its swap) and the rollup then gives way to it; or the rollup swaps first and the replay finds
    the rows in the merged partition. Either way: every offset once, the replayed ones the replay's."""
    rows = 150_000
    p = over_the_bound(engine, make_pipe, rows)
    replay = small_batch(engine, p, 0, 10, kind=BatchKind.REPLAY, amount="2.00")
    rolling = RollupInThread(engine, p)
    rolling.copying()
    result = commit_batch(engine, p.spec, replay.batch_id)
    merged = rolling.join()
    assert not result.already_committed and result.rows_written == 10
    assert counts(engine, p, replay.batch_id) == (3 * rows, 3 * rows, 10)
    assert verify(engine, p.spec) == []
    if merged is None:  # it gave way to the replay, as a lock it could not have (55P03), and merges next time
        assert ("RollupGaveWay", "55P03") in {(e, s) for (name, u, e, s) in upkeep_failures.failure_counts()
                                              if name == p.name and u == "rollup"}
        assert roll_up(engine, p.spec) is not None
    assert n_partitions(engine, p) == 2
    assert counts(engine, p, replay.batch_id) == (3 * rows, 3 * rows, 10)
    assert verify(engine, p.spec) == []


def repeatable_read_reader(engine):
    """A REPEATABLE READ transaction whose snapshot is taken now (it reads another table first, as a report may)."""
    conn = engine.connect()
    conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
    conn.execute(text("SELECT count(*) FROM ledger.cursors")).scalar_one()
    return conn


def test_a_rollup_gives_way_to_an_older_snapshot_that_stays_open_and_the_reader_sees_every_row(engine, make_pipe,
                                                                                             monkeypatch):
    monkeypatch.setattr(rollup, "SNAPSHOT_WAIT_S", 1.0)
    p = over_the_bound(engine, make_pipe, 100)
    reader = repeatable_read_reader(engine)
    try:
        assert roll_up(engine, p.spec) is None
        assert reader.execute(text(f'SELECT count(*) FROM public."{p.table}"')).scalar_one() == 300
    finally:
        reader.rollback()
        reader.close()
    assert upkeep_failures.failing(p.name)["rollup"].startswith("RollupGaveWay (SQLSTATE 55P03): snapshots older")
    assert n_partitions(engine, p) == 3
    assert roll_up(engine, p.spec) is not None  # the snapshot ended: the rollup merges
    assert n_partitions(engine, p) == 2 and counts(engine, p)[:2] == (300, 300)


def test_a_rollup_waits_for_an_older_snapshot_that_ends_and_the_reader_sees_every_row(engine, make_pipe):
    p = over_the_bound(engine, make_pipe, 100)
    reader = repeatable_read_reader(engine)
    seen = []

    def report():
        time.sleep(1.0)
        seen.append(reader.execute(text(f'SELECT count(*) FROM public."{p.table}"')).scalar_one())
        reader.rollback()
    ending = threading.Thread(target=report)
    ending.start()
    try:
        merged = roll_up(engine, p.spec)
    finally:
        ending.join()
        reader.close()
    assert seen == [300]  # it read the target before the rollup swapped, with every row
    assert merged is not None and merged.seconds >= 1.0
    assert n_partitions(engine, p) == 2 and counts(engine, p)[:2] == (300, 300)


def test_a_live_commit_behind_a_replay_that_waits_for_the_copy_does_not_wait_for_the_copy(engine, make_pipe,
                                                                                         monkeypatch):
    """A replay of offsets in a merged partition, committed during the copy, holds the commit lock and waits for the
    rollup's SHARE lock; the watchdog cancels the copy at once, so the replay, and a live commit queued behind it,
    wait a small fraction of what the copy takes."""
    rows = 1_000
    p = over_the_bound(engine, make_pipe, rows)
    live = small_batch(engine, p, 3 * rows, 3 * rows + 10)
    replay = small_batch(engine, p, 0, 10, kind=BatchKind.REPLAY, amount="2.00")
    slow_copies(monkeypatch)
    rolling = RollupInThread(engine, p)
    rolling.copying()
    replaying = threading.Thread(target=commit_batch, args=(engine, p.spec, replay.batch_id))
    replaying.start()
    with engine.connect() as conn:
        while not conn.execute(text("SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'relation'")
                               ).scalar_one():
            conn.rollback()
            time.sleep(0.005)
    started = time.monotonic()
    commit_batch(engine, p.spec, live.batch_id)
    live_wait = time.monotonic() - started
    replaying.join(60)
    assert rolling.join() is None  # it gave way to the replay
    assert live_wait < COPY_S / 3 and rolling.seconds < COPY_S, (live_wait, rolling.seconds)
    assert upkeep_failures.failing(p.name)["rollup"].startswith("RollupGaveWay (SQLSTATE 55P03): a backend waited")
    assert counts(engine, p, replay.batch_id) == (3 * rows + 10, 3 * rows + 10, 10)
    assert verify(engine, p.spec) == []


def test_a_users_update_waiting_for_a_merged_partition_is_not_cancelled_by_the_swap(engine, make_pipe, monkeypatch):
    """The UPDATE holds the target and waits for a merged partition just before the swap, whose DETACH then waits for
    the UPDATE: the watchdog cancels the rollup before PostgreSQL's deadlock check (deadlock_timeout) cancels
    either, so the rollup gives way and the UPDATE runs."""
    p = over_the_bound(engine, make_pipe, 100)
    outcome, updating = [], []

    def update():
        with engine.begin() as conn:
            outcome.append(conn.execute(text(f'UPDATE public."{p.table}" SET amount = amount + 1 '
                                             "WHERE _offset = 5")).rowcount)
    original = rollup._await_commit_lock

    def then_an_update(conn, lock):  # the UPDATE starts after the rollup's last look before its swap
        original(conn, lock)
        updating.append(threading.Thread(target=update))
        updating[0].start()
        with engine.connect() as look:
            while not look.execute(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                        "AND query LIKE 'UPDATE%'")).scalar_one():
                look.rollback()
                time.sleep(0.005)
    monkeypatch.setattr(rollup, "_await_commit_lock", then_an_update)
    assert roll_up(engine, p.spec) is None
    updating[0].join(30)
    assert outcome == [1]
    assert upkeep_failures.failing(p.name)["rollup"].startswith("RollupGaveWay (SQLSTATE 55P03): a backend waited")
    monkeypatch.undo()
    assert roll_up(engine, p.spec) is not None
    assert n_partitions(engine, p) == 2 and verify(engine, p.spec) == []


def test_a_cancel_that_reaches_the_rollups_commit_leaves_it_rolled_back_and_counted(engine, make_pipe, monkeypatch):
    """The rollup asks the catalog whether its swap committed (here it did not: the cancel came before the commit
    record, held back by a deferred trigger of the rollup's transaction); the connection serves the next rollup."""
    p = over_the_bound(engine, make_pipe, 100)
    original = rollup._copy_and_swap

    def slow_commit(conn, *args):
        original(conn, *args)
        conn.execute(text("CREATE TEMP TABLE slow_commit (x int) ON COMMIT DROP; CREATE FUNCTION pg_temp.nap() "
                          "RETURNS trigger LANGUAGE plpgsql AS $$BEGIN PERFORM pg_sleep(3); RETURN NULL; END$$; "
                          "CREATE CONSTRAINT TRIGGER nap AFTER INSERT ON slow_commit DEFERRABLE INITIALLY DEFERRED "
                          "FOR EACH ROW EXECUTE FUNCTION pg_temp.nap(); INSERT INTO slow_commit VALUES (1)"))
    monkeypatch.setattr(rollup, "_copy_and_swap", slow_commit)
    cancelled = []

    def cancel_the_commit():
        with engine.connect() as conn:
            while not cancelled:
                cancelled.extend(conn.execute(text("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query = "
                                               "'COMMIT' AND wait_event = 'PgSleep'")).scalars())
                conn.rollback()
                time.sleep(0.02)
    canceller = threading.Thread(target=cancel_the_commit)
    canceller.start()
    assert roll_up(engine, p.spec) is None
    canceller.join(30)
    assert cancelled == [True]
    assert upkeep_failures.failing(p.name)["rollup"].startswith("OperationalError (SQLSTATE 57014)")
    assert n_partitions(engine, p) == 3 and verify(engine, p.spec) == []
    monkeypatch.undo()
    assert roll_up(engine, p.spec) is not None
    assert n_partitions(engine, p) == 2 and counts(engine, p)[:2] == (300, 300)

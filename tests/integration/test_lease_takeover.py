"""Attempt leases across two runners (two engines: two followers' connection pools).

Only an attempt this process itself left unfinished, and that is still the batch's current attempt, is taken
over without waiting for its lease (stage/lease.py: begin_own_attempt judges it on the locked batch row); what
a process remembers of its attempts is bounded."""
import threading

import pytest
from sqlalchemy import text

from ledgerbatch.ledger.batches import begin_attempt, get_batch
from ledgerbatch.ledger.engine import fresh_database, make_engine
from ledgerbatch.ledger.migrations import migrate
from ledgerbatch.model.batch import BatchStatus
from ledgerbatch.stage import lease, process
from ledgerbatch.stage.lease import LEASE_S, AttemptLease, begin_own_attempt
from ledgerbatch.stage.process import process_batch
from ledgerbatch.stage.tables import staging_name

from .staged import Staged, begin, fill, plan


@pytest.fixture
def other_engine(db_url):
    """The other follower's pool."""
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


def leave(engine, batch_id: int, attempt: int) -> None:
    """This process stages `attempt` and leaves it unfinished (the database went away under it)."""
    with pytest.raises(ConnectionError):
        with AttemptLease(engine, batch_id, attempt):
            raise ConnectionError("server closed the connection unexpectedly")


def lapse(engine, batch_id: int) -> None:
    """The outage outlived the lease."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE ledger.batches SET heartbeat_at = now() - interval '20 seconds' WHERE batch_id = :b"),
                     {"b": batch_id})


def test_an_attempt_this_process_left_is_taken_over_at_once(engine, make_pipe):
    p = make_pipe()
    s = begin(engine, p, plan(engine, p, {0: (0, 2)}))
    leave(engine, s.batch_id, s.attempt)  # its lease is still fresh: nothing renews it any more
    with engine.begin() as conn:
        assert begin_own_attempt(conn, s.batch_id) == s.attempt + 1


def test_another_runners_newer_attempt_is_waited_for(engine, other_engine, make_pipe):
    p = make_pipe()
    s = begin(engine, p, plan(engine, p, {0: (0, 2)}))
    leave(engine, s.batch_id, s.attempt)
    lapse(engine, s.batch_id)
    with other_engine.begin() as conn:  # B comes back first: attempt 1's lease lapsed
        b_attempt = begin_attempt(conn, s.batch_id, None, LEASE_S)
    with engine.begin() as conn:  # A: attempt 1 was its own, but it is no longer the current one
        assert begin_own_attempt(conn, s.batch_id) is None
        assert get_batch(conn, s.batch_id).attempt == b_attempt


def test_the_judgement_is_atomic_with_a_runner_beginning_meanwhile(engine, other_engine, make_pipe):
    """B's attempt begins (uncommitted) while A is about to take over its own left attempt: A waits for B's row,
    then judges the attempt B made, not the one A read before."""
    p = make_pipe()
    s = begin(engine, p, plan(engine, p, {0: (0, 2)}))
    leave(engine, s.batch_id, s.attempt)
    lapse(engine, s.batch_id)
    outcome = {}

    def follower_a():
        with engine.begin() as conn:
            outcome["attempt"] = begin_own_attempt(conn, s.batch_id)

    with other_engine.begin() as conn:
        b_attempt = begin_attempt(conn, s.batch_id, None, LEASE_S)
        a = threading.Thread(target=follower_a)
        a.start()
        a.join(1.0)
        assert a.is_alive()  # A waits on the row B is changing
    a.join(10)
    assert outcome == {"attempt": None}
    with engine.connect() as conn:
        assert get_batch(conn, s.batch_id).attempt == b_attempt


def test_a_follower_back_from_an_outage_waits_for_the_other_followers_fresh_attempt(engine, other_engine, db_url,
                                                                                     make_pipe, monkeypatch):
    """The review's scenario end to end (repro_lease_bypass_fences_live_attempt.py): A left attempt 1 and the
    outage outlived the lease; A's process_batch reads the batch (attempt 1), and before it begins its attempt
    B begins attempt 2 and stages. A waits, then finds B's batch staged; B's mark is not fenced."""
    p = make_pipe()
    s = begin(engine, p, plan(engine, p, {0: (0, 2)}))
    leave(engine, s.batch_id, s.attempt)
    lapse(engine, s.batch_id)
    read, go = threading.Event(), threading.Event()
    shape_of = process.transform.batch_shape

    def paused_after_the_read(spark, spec):  # between process_batch's read and its new attempt
        read.set()
        go.wait(10)
        return shape_of(spark, spec)

    monkeypatch.setattr(process.transform, "batch_shape", paused_after_the_read)
    outcome = {}

    def follower_a():
        try:
            outcome["batch"] = process_batch(None, engine, p.spec, s.batch_id, db_url, "127.0.0.1:9")
        except Exception as exc:  # noqa: BLE001
            outcome["error"] = exc

    a = threading.Thread(target=follower_a)
    a.start()
    assert read.wait(10)
    b = begin(other_engine, p, s.batch_id)  # B, back first, over the lapsed lease
    with AttemptLease(other_engine, b.batch_id, b.attempt, every_s=0.3):
        go.set()
        a.join(2.0)
        assert a.is_alive(), outcome  # waiting for B, not fencing it
        fill(other_engine, p, Staged(b.batch_id, b.attempt, staging_name(b.batch_id, b.attempt)),
             good=[(0, 0, "o-0", "1.00"), (0, 1, "o-1", "1.00")])  # B's mark is not fenced
    a.join(30)
    assert (outcome["batch"].status, outcome["batch"].attempt) == (BatchStatus.STAGED, b.attempt), outcome


def test_only_attempts_left_unfinished_are_remembered_and_only_so_many(engine, monkeypatch):
    monkeypatch.setattr(lease, "_LEFT", type(lease._LEFT)())
    for batch_id in range(1_000_000, 1_001_000):  # staged: nothing kept
        with AttemptLease(engine, batch_id, 1):
            pass
    assert len(lease._LEFT) == 0
    for batch_id in range(1_000_000, 1_000_000 + 3 * lease.LEFT_KEPT):
        leave(engine, batch_id, 1)
    assert len(lease._LEFT) == lease.LEFT_KEPT
    assert lease.left_here(engine, 1_000_000 + 3 * lease.LEFT_KEPT - 1, 1)
    assert not lease.left_here(engine, 1_000_000, 1)
    with AttemptLease(engine, 1_000_000 + 3 * lease.LEFT_KEPT - 1, 2):  # a later attempt staged it: forgotten
        pass
    assert len(lease._LEFT) == lease.LEFT_KEPT - 1


def test_an_attempt_left_in_another_ledger_is_not_this_ledgers(engine, db_url, make_pipe):
    name = f"{engine.url.database}_other"
    other = make_engine(fresh_database(db_url, name))  # one process, two ledgers
    try:
        migrate(other)
        p = make_pipe()
        s = begin(engine, p, plan(engine, p, {0: (0, 2)}))  # another runner's live attempt here
        leave(other, s.batch_id, s.attempt)  # the same batch id and attempt, left in the other ledger
        with engine.begin() as conn:
            assert begin_own_attempt(conn, s.batch_id) is None  # waited for, not fenced
    finally:
        other.dispose()
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

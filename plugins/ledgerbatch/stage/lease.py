"""Attempt leases: one runner stages a batch at a time, and a dead or frozen one is taken over.

The process staging an attempt renews its lease (ledger.batches.heartbeat_at) every LEASE_S / 3 seconds
while its tasks run. Another runner that comes for the batch meanwhile (two `run --follow`, a CLI run
beside an Airflow task) waits for that attempt to finish instead of starting a new attempt that would
fence it, and after it the two fight over nothing: the batch is staged or committed. A lease not
renewed for LEASE_S seconds belongs to a process that died or froze (SIGSTOP, a paused VM): the next
runner begins a new attempt, and the old one is fenced at its mark and at the commit as before. An attempt
this process staged and has left unfinished (the database went away under it, so its failure may not be in
the ledger) is not waited for: its lease is this process's own, and nothing renews it any more. That holds
only while it is still the batch's current attempt: `begin_own_attempt` judges it against the batch row it
has locked, so another runner's newer attempt (begun meanwhile over the lapsed lease) is waited for as any.
A process remembers only the attempts it left unfinished, the last LEFT_KEPT of them, each by its ledger
database as well as its batch id (one process may serve several ledgers, whose batch ids overlap).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

from sqlalchemy.engine import Connection, Engine

from ledgerbatch.ledger.batches import attempt_held, begin_attempt, get_batch, renew_lease
from ledgerbatch.model.batch import Batch, BatchStatus

log = logging.getLogger(__name__)
LEASE_S = 15.0
WAIT_POLL_S = 1.0
LEFT_KEPT = 64  # attempts left unfinished that a process remembers (the oldest forgotten first)
_LEFT: OrderedDict[tuple[str, int], int] = OrderedDict()  # (ledger, batch id) -> the attempt of it left unfinished
_LEFT_LOCK = threading.Lock()


class AttemptLease:
    """`with AttemptLease(engine, batch_id, attempt):` renews the attempt's lease from a thread until the
    block ends (or the attempt no longer owns the batch unstaged)."""

    def __init__(self, engine: Engine, batch_id: int, attempt: int, every_s: float = LEASE_S / 3):
        self.engine, self.batch_id, self.attempt, self.every_s = engine, batch_id, attempt, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"lease-b{batch_id}-a{attempt}", daemon=True)

    def __enter__(self) -> AttemptLease:
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        self._thread.join()
        key = (_ledger(self.engine), self.batch_id)
        if exc_type is None:  # staged: the batch's lease no longer matters
            _forget(key)
        else:  # left unfinished: its failure may not have reached the ledger
            _remember(key, self.attempt)

    def _renew(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                with self.engine.begin() as conn:
                    if not renew_lease(conn, self.batch_id, self.attempt):
                        return
            except Exception as exc:  # noqa: BLE001  (the database away: the lease may lapse, fencing stays safe)
                log.warning("batch %d attempt %d: cannot renew its lease: %s", self.batch_id, self.attempt, exc)


def _ledger(engine: Engine) -> str:
    """The ledger database an engine reaches (its URL without the password)."""
    return engine.url.render_as_string(hide_password=True)


def _remember(key: tuple[str, int], attempt: int) -> None:
    with _LEFT_LOCK:
        _LEFT[key] = attempt
        _LEFT.move_to_end(key)
        while len(_LEFT) > LEFT_KEPT:
            _LEFT.popitem(last=False)


def _forget(key: tuple[str, int]) -> None:
    with _LEFT_LOCK:
        _LEFT.pop(key, None)


def left_here(engine: Engine, batch_id: int, attempt: int) -> bool:
    """Whether `attempt` of the batch in this ledger is one this process staged and left unfinished."""
    with _LEFT_LOCK:
        return _LEFT.get((_ledger(engine), batch_id)) == attempt


def lease_of(engine: Engine, batch: Batch) -> float:
    """How fresh a lease of the batch's current attempt must be to be waited for: never for one this process
    left unfinished. Where it decides who begins the next attempt, `batch` is read locked (begin_own_attempt);
    wait_for_holder only decides whether to look again."""
    return 0.0 if batch.status == BatchStatus.PLANNED and left_here(engine, batch.batch_id, batch.attempt) else LEASE_S


def begin_own_attempt(conn: Connection, batch_id: int, output_schema: str | None = None) -> int | None:
    """Begin a new attempt of the batch in the caller's transaction, fencing the ones before (as
    ledger/batches.py: begin_attempt), or None while another attempt holds a live lease. The batch row is
    locked first, so the lease is judged against the attempt that is current when the new one begins: an
    attempt this process left is taken over at once only if it is still that one."""
    current = get_batch(conn, batch_id, for_update=True)
    return begin_attempt(conn, batch_id, output_schema, lease_of(conn.engine, current))


def wait_for_holder(engine: Engine, batch_id: int) -> Batch:
    """Wait while another attempt stages the batch under a live lease; returns the batch as it is then
    (staged or committed by the holder, or unstaged with a lapsed lease: the caller takes it over)."""
    started, said = time.monotonic(), False
    while True:
        with engine.connect() as conn:
            batch = get_batch(conn, batch_id)
            if not attempt_held(conn, batch_id, lease_of(engine, batch)):
                if said:
                    log.info("batch %d is no longer held (%s, attempt %d) after waiting %.1fs", batch_id,
                             batch.status, batch.attempt, time.monotonic() - started)
                return batch
        if not said:
            log.info("batch %d is being staged by another runner under a live lease: waiting for it", batch_id)
            said = True
        time.sleep(WAIT_POLL_S)

"""The rollup's watchdog: while a rollup's copy-and-swap transaction runs, a second connection of the same role looks
every WATCH_S whether any backend waits for a lock the rollup holds (a replay removing rows of a merged partition,
a user's UPDATE, a reader of the target behind the swap; not a commit waiting for the commit lock, which waits for
the swap's end) and cancels the rollup's running statement (pg_cancel_backend: allowed for the same role). The
rollup sees it as a cancelled statement and gives way (rollup.py); so nobody waits for its copy, and a writer
waiting on a merged partition is never the one PostgreSQL cancels as a deadlock with the swap (the watchdog looks
well within deadlock_timeout, 1 s by default).

The cancel names the rollup's transaction too (its xid): it never reaches a backend that has left it, and the
rollup stops its watchdog before it ends the transaction (`watching`), so a later statement of the connection is
never cancelled. One that arrives during COMMIT is the rollup's to sort out (rollup.py: the catalog says whether
the swap committed)."""
from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Iterator

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ledgerbatch.sqlfiles import query

log = logging.getLogger(__name__)
WATCH_S = 0.1


class Watchdog:
    def __init__(self, conn: Connection):
        self.engine = conn.engine
        row = conn.execute(text(query("rollup_backend"))).one()  # the transaction has its xid (it created a table)
        self.rollup = {"pid": row.pid, "xid": row.xid}
        self.cancelled = 0  # statements cancelled (a cancel that finds the rollup between statements does nothing)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"rollup-watchdog-{row.pid}", daemon=True)

    def _watch(self) -> None:
        try:
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                while not self._stop.wait(WATCH_S):
                    if conn.execute(text(query("cancel_rollup_if_waited_on")), self.rollup).scalar():
                        self.cancelled += 1
        except Exception as exc:  # noqa: BLE001 - the rollup's own looks for waiters remain
            log.warning("rollup watchdog of backend %s stopped: %s", self.rollup["pid"], exc)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def watching(conn: Connection) -> Iterator[Watchdog]:
    """Watch the rollup's transaction on `conn` until the block ends; call inside the transaction, so the
    watchdog has stopped (its last cancel sent) before the transaction ends."""
    dog = Watchdog(conn)
    dog.start()
    try:
        yield dog
    finally:
        dog.stop()

"""Upkeep gives way: a partition rollup, a compaction, a quarantine purge or the abandoning of stranded batches
that fails, for whatever reason (the target's own rules: a foreign key that references it, a view on one of
its partitions, a CHECK; a lock or statement timeout; a missing privilege; the database away), never stops the
pipeline and never fails the commit it follows. The failure is logged once with its reason (again only when
the reason changes, or after the upkeep worked again), counted (`ledgerbatch.upkeep.failures`, for
Prometheus `ledgerbatch_upkeep_failures_total`, by pipeline, upkeep and reason: ops/metrics.py reads the
counts kept here), and the upkeep is tried again at its next turn.

An upkeep that keeps failing is not tried again at once by what runs it after every commit (a merge may copy
many rows before it fails, under the commit lock): `resting` says for how long to leave it, 5 s after its first
failure, twice as long after each next one, at most 5 minutes.

The ledger keeps each pipeline's upkeeps failing now (ledger.upkeep_failures, migration 018: what failed,
when, why, how many times in a row), so that `ledgerbatch status` and ledger.pipeline_progress show a failure
of any process, the follower's too: `record` writes what happened since it last wrote (ops/history.py calls
it after the upkeep and after each commit's rollup); the row goes when the upkeep works again.

Counts are kept in this module, not on the process's instruments, so that recording a failure never builds
them (inside Airflow they are built with Airflow's own exporters by the first metric the task records)."""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterator

from sqlalchemy.engine import Engine

from ledgerbatch.ledger.sql import run

log = logging.getLogger(__name__)

_lock = threading.Lock()
_counts: dict[tuple[str, str, str, str], int] = {}  # (pipeline, upkeep, error type, SQLSTATE or "") -> failures
_failing: dict[tuple[str, str], str] = {}  # (pipeline, upkeep) -> the reason it last failed, until it works
_streak: dict[tuple[str, str], tuple[int, float]] = {}  # (pipeline, upkeep) -> (failures in a row, monotonic when last)
REST_FIRST_S, REST_MAX_S = 5.0, 300.0


@dataclass(frozen=True)
class Unrecorded:
    """Failures of an upkeep not yet written to the ledger (record)."""
    reason: Reason
    failures: int
    first_at: datetime
    last_at: datetime


_unrecorded: dict[tuple[str, str], Unrecorded | None] = {}  # (pipeline, upkeep) -> not in the ledger yet (None: worked)
_cleared: set[tuple[str, str]] = set()  # upkeeps this process cleared in the ledger and saw no failure of since


@dataclass(frozen=True)
class Reason:
    error_type: str  # the exception's class: IntegrityError, OperationalError, ...
    sqlstate: str  # the server's SQLSTATE (23514, 57014, 55P03, ...), or "" when the server gave none
    message: str  # the first line of the error

    def __str__(self) -> str:
        return f"{self.error_type}" + (f" (SQLSTATE {self.sqlstate})" if self.sqlstate else "") + f": {self.message}"


def reason_of(exc: BaseException) -> Reason:
    orig = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps the driver's error
    sqlstate = getattr(orig, "pgcode", None) or getattr(orig, "sqlstate", None) or ""
    lines = str(orig).strip().splitlines()
    return Reason(type(exc).__name__, str(sqlstate), lines[0] if lines else type(orig).__name__)


def gave_way(pipeline: str, upkeep: str, exc: BaseException) -> Reason:
    """Count a failed upkeep and log it (a warning the first time for its reason)."""
    reason = reason_of(exc)
    key = (pipeline, upkeep)
    with _lock:
        counted = (pipeline, upkeep, reason.error_type, reason.sqlstate)
        _counts[counted] = _counts.get(counted, 0) + 1
        said = _failing.get(key) == str(reason)
        _failing[key] = str(reason)
        _streak[key] = (_streak.get(key, (0, 0.0))[0] + 1, time.monotonic())
        now, before = datetime.now(timezone.utc), _unrecorded.get(key)
        _unrecorded[key] = Unrecorded(reason, before.failures + 1 if before else 1, before.first_at if before else now,
                                      now)
        _cleared.discard(key)
    if said:
        log.debug("%s: upkeep %s gave way again: %s", pipeline, upkeep, reason)
    elif reason.sqlstate or reason.error_type in _DATABASE_ERRORS:
        log.warning("%s: upkeep %s gave way (the pipeline goes on committing; it is tried again later, and this is "
                    "not logged again until its reason changes): %s", pipeline, upkeep, reason)
    else:  # not the database's answer: a fault of ledgerbatch's own, with its traceback
        log.warning("%s: upkeep %s gave way (the pipeline goes on committing; it is tried again later): %s",
                    pipeline, upkeep, reason, exc_info=exc)
    return reason


def worked(pipeline: str, upkeep: str) -> None:
    """The upkeep ran to its end: say so if it had been failing."""
    with _lock:
        reason = _failing.pop((pipeline, upkeep), None)
        _streak.pop((pipeline, upkeep), None)
        if (pipeline, upkeep) not in _cleared:  # it may be failing in the ledger: cleared at the next record
            _unrecorded[(pipeline, upkeep)] = None
    if reason is not None:
        log.info("%s: upkeep %s works again (it had given way: %s)", pipeline, upkeep, reason)


@dataclass
class Outcome:
    reason: Reason | None = None

    @property
    def failed(self) -> bool:
        return self.reason is not None


@contextmanager
def giving_way(pipeline: str, upkeep: str) -> Iterator[Outcome]:
    """`with giving_way(spec.name, "rollup") as outcome:` runs an upkeep (rollup, compaction, purge,
    abandon_stranded: the metric's `ledgerbatch.upkeep`); an Exception it raises is logged and
    counted (gave_way) and goes no further: `outcome.failed` says so. KeyboardInterrupt and SystemExit pass."""
    outcome = Outcome()
    try:
        yield outcome
    except Exception as exc:  # noqa: BLE001 - nothing of history may stop a pipeline
        outcome.reason = gave_way(pipeline, upkeep, exc)
    else:
        worked(pipeline, upkeep)


def resting(pipeline: str, upkeep: str) -> float:
    """Seconds to leave an upkeep that failed the last times before trying it again after a commit (0: try)."""
    with _lock:
        failures, at = _streak.get((pipeline, upkeep), (0, 0.0))
    if not failures:
        return 0.0
    return max(0.0, at + min(REST_FIRST_S * 2 ** (failures - 1), REST_MAX_S) - time.monotonic())


def record(engine: Engine, pipeline: str) -> None:
    """Write the pipeline's upkeep outcomes since the last record to the ledger: a failure adds to its count in
    a row, a success clears it. Never raises: what it cannot write (the database away) waits for the next time."""
    with _lock:
        pending = {key: outcome for key, outcome in _unrecorded.items() if key[0] == pipeline}
    if not pending:
        return
    try:
        with engine.begin() as conn:
            for (_, upkeep), outcome in pending.items():
                if outcome is None:
                    run(conn, "upkeep_worked", {"pipeline": pipeline, "upkeep": upkeep})
                else:
                    run(conn, "upkeep_failed", {"pipeline": pipeline, "upkeep": upkeep, "reason": str(outcome.reason),
                                                "sqlstate": outcome.reason.sqlstate, "failures": outcome.failures,
                                                "first_failed_at": outcome.first_at, "failed_at": outcome.last_at})
    except Exception as exc:  # noqa: BLE001 - recording a failure must not be one
        log.debug("%s: upkeep failures not recorded in the ledger this time: %s", pipeline, reason_of(exc))
        return
    with _lock:
        for key, written in pending.items():
            now = _unrecorded.get(key, written)
            if now is written:
                _unrecorded.pop(key, None)
                if written is None:
                    _cleared.add(key)
            elif now is not None and written is not None:  # failed again meanwhile: only those are new
                _unrecorded[key] = Unrecorded(now.reason, now.failures - written.failures, written.last_at, now.last_at)


def failure_counts() -> dict[tuple[str, str, str, str], int]:
    """(pipeline, upkeep, error type, SQLSTATE) -> failures in this process so far (for the metric)."""
    with _lock:
        return dict(_counts)


def failing(pipeline: str) -> dict[str, str]:
    """The pipeline's upkeeps failing now in this process, with their reason."""
    with _lock:
        return {upkeep: reason for (p, upkeep), reason in _failing.items() if p == pipeline}


_DATABASE_ERRORS = {"OperationalError", "IntegrityError", "ProgrammingError", "InternalError", "DataError",
                    "NotSupportedError", "DatabaseError", "InterfaceError", "DBAPIError"}

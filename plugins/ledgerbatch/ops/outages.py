"""What an error means, and riding through outages in `run --follow`.

Every error a run can meet is one of four kinds, decided here and nowhere else (`decide`):

- **the record's fault**: a row the target refuses alone (a value too long, a CHECK, an index row over
  the btree maximum, a trigger's own code). The commit quarantines such rows with their SQLSTATE and
  writes the rest (commit/rejects.py); one that reaches the runner anyway stops it with its reason;
- **an outage**: a dependency that went away (the database restarting, failing over, read-only, out of
  connections; every Kafka broker down; the registry, Spark or its executors gone while a batch was
  read). A follower waits it out with capped exponential backoff and jitter, then carries on where the
  ledger says: a batch whose COMMIT's outcome was lost with the connection is committed or not in the
  ledger, and the next step reads which. One line is logged when an outage starts and one when it ends,
  with how long it lasted, and both are counted in the metrics;
- **the operator's or the spec's fault**: a bad spec, a permission refused, a statement_timeout shorter
  than the commit, offsets lost to retention, a batch over errors.max_ratio, a fenced or abandoned batch.
  Waiting cannot fix it: the run stops (the follower exits, the Airflow task fails) with the reason and
  what to do;
- **a bug**: anything else. It stops loudly.

A database error is judged by its SQLSTATE (`SQLSTATES`, shown in docs/failure-and-recovery.md): which are a
row's fault is commit/row_errors.py's table (the commit quarantines by it), the rest is here. An error
without one (libpq could not connect, the connection dropped) is an outage unless its message says the
server answered and refused (a password, a role or database that does not exist, pg_hba.conf).
"""
from __future__ import annotations

import enum
import logging
import random
import threading
import time
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from ledgerbatch.commit.row_errors import row_error
from ledgerbatch.errors import OVER_BUDGET, BatchFailedError, LedgerbatchError, UnavailableError

log = logging.getLogger(__name__)
DATABASE = "database"


class Kind(enum.Enum):
    RECORD = "the record's fault"
    OUTAGE = "an outage"
    OPERATOR = "the operator's or the spec's fault"
    BUG = "a bug"


@dataclass(frozen=True)
class Decision:
    kind: Kind
    dependency: str | None = None  # an outage's: database, Kafka, schema registry, Spark
    todo: str = ""  # what to do, where the runner stops

    @property
    def waitable(self) -> bool:
        return self.kind is Kind.OUTAGE


def _outage(dependency: str, why: str = "") -> Decision:
    return Decision(Kind.OUTAGE, dependency, why)


RECORD = Decision(Kind.RECORD, todo="a row the target refuses alone is quarantined at the commit; one that fails the "
                                    "whole statement needs the target (or the record) fixed")
GRANT = Decision(Kind.OPERATOR, todo="grant the role what it needs (docs/operations.md: Database roles)")
STATEMENT_TIMEOUT = Decision(Kind.OPERATOR, todo=(
    "a statement_timeout (the role's, the database's or the URL's options) is shorter than this statement: raise it "
    "for the role that runs ledgerbatch (ALTER ROLE ... SET statement_timeout = ...) or make batches smaller "
    "(batch.max_records); the batch stays in the ledger and the next run resumes it"))
SERVER = Decision(Kind.OPERATOR, todo="the server reports a fault of its own: see its log")
BUG = Decision(Kind.BUG, todo="an unexpected error: please report it with LEDGERBATCH_DEBUG=1's traceback")

# SQLSTATE -> decision: a row's fault first (commit/row_errors.py: classes 22, 23, 54, P0 and codes of no
# class PostgreSQL defines, a trigger's own), then an exact code, then its class (the first two characters).
SQLSTATES: dict[str, Decision] = {
    "08": _outage(DATABASE, "connection exception"),
    "25006": _outage(DATABASE, "read-only transaction: a standby not yet promoted"),
    "25": BUG,  # invalid transaction state
    "40001": _outage(DATABASE, "serialization failure (a standby's recovery conflict too): tried again"),
    "40P01": _outage(DATABASE, "deadlock detected: tried again"),
    "40003": _outage(DATABASE, "statement completion unknown: the ledger holds the outcome"),
    "40": BUG,
    "42501": GRANT,  # insufficient privilege
    "42": Decision(Kind.OPERATOR, todo="the SQL does not fit the database: a target or the ledger changed by hand, "
                                       "or `ledgerbatch migrate` not run"),
    "53400": Decision(Kind.OPERATOR, todo="a server setting's limit (configuration_limit_exceeded): raise it"),
    "53": _outage(DATABASE, "insufficient resources: too many connections, disk full, out of memory"),
    "55P03": _outage(DATABASE, "lock not available: lock_timeout while another transaction holds the lock"),
    "55": Decision(Kind.OPERATOR, todo="an object not in the state this needs (object_not_in_prerequisite_state)"),
    "57014": STATEMENT_TIMEOUT,  # unless it cut a lock wait short or came by hand: sqlstate_decision
    "57P01": _outage(DATABASE, "admin shutdown"),
    "57P02": _outage(DATABASE, "crash shutdown"),
    "57P03": _outage(DATABASE, "cannot connect now: starting up or shutting down"),
    "57P05": _outage(DATABASE, "idle session timeout: the connection is made again"),
    "57": Decision(Kind.OPERATOR, todo="an operator intervened (a database dropped, a session ended by hand)"),
    "58": SERVER,  # system error: an I/O error, a file missing
    "XX": Decision(Kind.BUG, todo="the server's internal error or corruption: see its log"),
    "0A": Decision(Kind.OPERATOR, todo="a feature the server does not support for this target"),
    "F0": SERVER,  # configuration file error
    "HV": SERVER,  # foreign data wrapper error
}
_OTHER = Decision(Kind.OPERATOR, todo="the database refused the statement")
# A 57014 that waiting fixes: a wait for one of ledgerbatch's advisory locks (another runner's commit, a
# rollup, a compaction holds it) that a statement_timeout cut short, or a statement canceled by hand.
_LOCK_WAITS = ("pg_advisory_xact_lock", "pg_advisory_lock")
_CANCELED_BY_HAND = "canceling statement due to user request"
# A connection refused by a server that answered: waiting does not fix these.
_REFUSED_AT_CONNECT = (("password authentication failed", GRANT), ("no pg_hba.conf entry", GRANT),
                       ("is not permitted to log in", GRANT), ("permission denied", GRANT),
                       ("does not exist", Decision(Kind.OPERATOR, todo="check LEDGERBATCH_DB_URL's database and user")),
                       ("certificate verify failed", Decision(Kind.OPERATOR, todo="check the URL's ssl settings")),
                       ("authentication failed", GRANT))
# What a failed read's reason names (it crosses Spark as text); anything else is Spark's own trouble.
_READ_DEPENDENCIES = (("schema registry", "schema registry"), ("connection to server", DATABASE),
                      ("server closed the connection", DATABASE), ("Kafka", "Kafka"), ("rdkafka", "Kafka"))
# A staging task's database error that waiting does not fix (its COPY's statement_timeout, its login refused).
_READ_STOPS = (("canceling statement due to statement timeout", STATEMENT_TIMEOUT),
               ("password authentication failed", GRANT), ("no pg_hba.conf entry", GRANT))
_BAD_DATA = Decision(Kind.OPERATOR, todo="more bad records than the spec's errors section allows: look at them (the "
                                         "message names their table); the next start plans a batch over "
                                         "errors.max_ratio again, and resumes one under errors.policy fail")
_SPEC_BY_SPARK = ("AnalysisException", "ParseException")  # Spark refused the spec's query: not Spark's outage


def sqlstate_decision(code: str, message: str = "", statement: str = "") -> Decision:
    """What a database error of SQLSTATE `code` (with its message and the statement that raised it) means."""
    if code == "57014" and (_CANCELED_BY_HAND in message or any(lock in statement for lock in _LOCK_WAITS)):
        return _outage(DATABASE, "a lock wait cut short by statement_timeout, or a statement canceled by hand")
    if code == "53200" and "max_locks_per_transaction" in message:
        return Decision(Kind.OPERATOR, todo="raise max_locks_per_transaction (the batch needs more locks)")
    if row_error(code):
        return RECORD
    return SQLSTATES.get(code) or SQLSTATES.get(code[:2]) or _OTHER


def decide(exc: BaseException) -> Decision:
    """The one decision: what `exc` is (the record's fault, an outage, the operator's, a bug)."""
    if isinstance(exc, UnavailableError):
        return _outage(exc.dependency)
    if isinstance(exc, DBAPIError) or _is_psycopg2(exc):
        return _database(exc)
    from ledgerbatch.source.reader import RangeReadError

    if isinstance(exc, RangeReadError):
        return _outage("Kafka") if exc.retriable else Decision(Kind.OPERATOR, todo="Kafka refused the read")
    if isinstance(exc, BatchFailedError):  # the attempt failed and is in the ledger; the next one takes over
        return _failed_read(str(exc))
    if isinstance(exc, LedgerbatchError):
        return Decision(Kind.OPERATOR)  # its message says what to do
    names = {c.__name__ for c in type(exc).__mro__}
    if type(exc).__module__.startswith(("pyspark.errors", "grpc", "py4j")):
        return Decision(Kind.OPERATOR, todo="fix the spec's transform") if names & set(_SPEC_BY_SPARK) \
            else _outage("Spark")
    return BUG


def waitable(exc: BaseException) -> str | None:
    """The dependency an error says is away, or None where waiting cannot fix it."""
    decision = decide(exc)
    return decision.dependency if decision.waitable else None


def connection_lost(exc: BaseException) -> bool:
    """The database connection went away under a statement (its outcome unknown to this side)."""
    if not isinstance(exc, DBAPIError):
        return False
    code = getattr(exc.orig, "pgcode", None) or ""
    return bool(exc.connection_invalidated or (not code and isinstance(exc, (OperationalError, InterfaceError)))
                or code.startswith("08") or code in ("57P01", "57P02", "57P03"))


def stopped(exc: BaseException, pipeline: str) -> LedgerbatchError | None:
    """The error a runner stops with for a database error waiting cannot fix: its reason, SQLSTATE and what to
    do; None for any other error (it stops with its own message)."""
    if not (isinstance(exc, DBAPIError) or _is_psycopg2(exc)):
        return None
    decision = decide(exc)
    orig = getattr(exc, "orig", exc)
    code = getattr(orig, "pgcode", None)
    return LedgerbatchError(f"{pipeline}: stopped on a database error, {decision.kind.value}, not an outage: "
                            f"{_reason(exc)}{f' (SQLSTATE {code})' if code else ''}"
                            f"{f'; {decision.todo}' if decision.todo else ''}")


def _database(exc: BaseException) -> Decision:
    orig = getattr(exc, "orig", exc)
    code = getattr(orig, "pgcode", None) or ""
    message = str(orig)
    if code:
        return sqlstate_decision(code, message, str(getattr(exc, "statement", "") or ""))
    if getattr(exc, "connection_invalidated", False):
        return _outage(DATABASE, "connection lost")
    import psycopg2

    if isinstance(exc, (OperationalError, InterfaceError)) or isinstance(orig, (psycopg2.OperationalError,
                                                                                psycopg2.InterfaceError)):
        # libpq's own errors carry no SQLSTATE: a refused connection is an outage, a refused login is not
        return next((d for said, d in _REFUSED_AT_CONNECT if said in message), None) or _outage(DATABASE)
    return BUG


def _failed_read(reason: str) -> Decision:
    """A batch whose read failed: its reason crossed Spark as text."""
    if OVER_BUDGET in reason or "errors.policy is fail" in reason:
        return _BAD_DATA
    stop = next((d for said, d in _READ_STOPS if said in reason), None)
    if stop is not None:
        return stop
    return _outage(next((dependency for said, dependency in _READ_DEPENDENCIES if said in reason), "Spark"))


def _is_psycopg2(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("psycopg2")


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 1.0
    max_s: float = 60.0

    def delay(self, attempt: int) -> float:
        """A random wait between half and all of initial * 2^attempt, capped (attempt counts from 0): runners
        that lost the same server do not all come back at once."""
        return random.uniform(0.5, 1.0) * min(self.max_s, self.initial_s * 2 ** min(attempt, 30))


class Outage:
    """One pipeline's outages as they are logged (and counted): `failed` after a try that a wait can fix,
    `ok` after one that succeeded. One line when an outage starts, one where its reason changes (a standby,
    then read-only), one when it ends."""

    def __init__(self, pipeline: str, counted=None, logger: logging.Logger | None = None):
        self.pipeline, self.counted, self.log = pipeline, counted, logger or log
        self.dependency: str | None = None
        self.reason = ""
        self.started = 0.0
        self.attempts = 0

    def failed(self, dependency: str, exc: BaseException, retry: str) -> None:
        reason = _reason(exc)
        if self.dependency is None:
            self.dependency, self.started = dependency, time.monotonic()
            self.log.warning("%s: outage started: %s unavailable (%s); %s", self.pipeline, dependency, reason, retry)
        elif reason != self.reason:
            self.log.info("%s: still unavailable after %d tries: %s", self.pipeline, self.attempts, reason)
        self.reason = reason
        self.attempts += 1

    def ok(self) -> None:
        if self.dependency is None:
            return
        seconds = time.monotonic() - self.started
        self.log.warning("%s: outage ended: %s back after %.1fs (%d tries)", self.pipeline, self.dependency, seconds,
                         self.attempts)
        if self.counted:
            self.counted(self.pipeline, self.dependency, seconds)
        self.dependency, self.attempts = None, 0


class OutageRider(Outage):
    """A follower's outages, waited out with backoff: `wait` after an error a wait can fix."""

    def __init__(self, pipeline: str, stop: threading.Event, backoff: Backoff, counted=None):
        super().__init__(pipeline, counted)
        self.stop, self.backoff = stop, backoff

    def wait(self, dependency: str, exc: BaseException) -> None:
        """Wait before the next try; returns at once when `stop` is set (SIGTERM)."""
        delay = self.backoff.delay(self.attempts)
        self.failed(dependency, exc, f"trying again with backoff up to {self.backoff.max_s:g}s")
        self.stop.wait(delay)


def _reason(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

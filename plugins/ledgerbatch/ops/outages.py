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
server answered and refused (a password, a role or database that does not exist, pg_hba.conf). Kafka,
the registry and a staging task that answered and refused (an ACL, SASL credentials, a registry's 401/403,
a grant on the staging schema) are the operator's at once, whatever text they cross Spark as.

A failed staging task whose reason names no dependency is only *presumed* Spark's outage: a task that
fails identically on every attempt (a decoder raising on every record, a transform's bug) would be waited
out for ever. So the follower counts a presumed outage's identical errors, and after
`Backoff.same_error_limit` of them in a row (`run --follow --same-error-limit`), with the database and
Kafka answering, it stops with the error and what to do.
"""
from __future__ import annotations

import enum
import logging
import random
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

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
    presumed: bool = False  # an outage guessed (nothing named the dependency): ended by the same error repeating

    @property
    def waitable(self) -> bool:
        return self.kind is Kind.OUTAGE


def _outage(dependency: str, why: str = "") -> Decision:
    return Decision(Kind.OUTAGE, dependency, why)


RECORD = Decision(Kind.RECORD, todo="a row the target refuses alone is quarantined at the commit; one that fails the "
                                    "whole statement needs the target (or the record) fixed")
GRANT = Decision(Kind.OPERATOR, todo="grant the role what it needs (docs/operations.md: Database roles)")
KAFKA_ACCESS = Decision(Kind.OPERATOR, todo=(
    "Kafka answered and refused this client: grant its principal Read and Describe on the topics and the "
    "consumer group (ACLs), or fix the SASL/SSL settings (LEDGERBATCH_KAFKA_OPTIONS, source.kafka_options)"))
REGISTRY_ACCESS = Decision(Kind.OPERATOR, todo=(
    "the schema registry answered and refused the credentials (401/403): fix basic.auth.user.info or the "
    "bearer settings (LEDGERBATCH_SCHEMA_REGISTRY, source.schema_registry) or the registry's ACLs"))
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
# A wait for a row lock says so in the error's context, naming the row's table (a target row a user updates,
# a foreign key's parent row held FOR UPDATE): "while locking tuple (0,1) in relation "parent"".
_ROW_WAIT = re.compile(r'tuple \(\d+,\d+\) in relation "(.+)"$', re.M)
# A connection refused by a server that answered: waiting does not fix these.
_REFUSED_AT_CONNECT = (("password authentication failed", GRANT), ("no pg_hba.conf entry", GRANT),
                       ("is not permitted to log in", GRANT), ("permission denied", GRANT),
                       ("does not exist", Decision(Kind.OPERATOR, todo="check LEDGERBATCH_DB_URL's database and user")),
                       ("certificate verify failed", Decision(Kind.OPERATOR, todo="check the URL's ssl settings")),
                       ("authentication failed", GRANT))
# What a failed read's reason names (it crosses Spark as text); anything else is presumed Spark's trouble. The
# reason is the last line of the task's traceback (stage/process.py), so a psycopg2 error is known there by
# libpq's last line too: a refused connection's hint, a killed backend's "before or while processing".
_READ_DEPENDENCIES = (("schema registry", "schema registry"), ("connection to server", DATABASE),
                      ("server closed the connection", DATABASE), ("psycopg2.OperationalError", DATABASE),
                      ("psycopg2.InterfaceError", DATABASE), ("Is the server running", DATABASE),
                      ("terminated abnormally", DATABASE), ("before or while processing the request", DATABASE),
                      ("Kafka", "Kafka"), ("rdkafka", "Kafka"),
                      ("StatusCode.UNAVAILABLE", "Spark"), ("RPC that terminated", "Spark"),
                      ("SparkConnectGrpcException", "Spark"), ("ExecutorLostFailure", "Spark"),
                      ("SparkContext was shut down", "Spark"))
# librdkafka's refusals, by code and as their text (KafkaError.str()) crosses Spark or UnavailableError.
KAFKA_REFUSALS = {"TOPIC_AUTHORIZATION_FAILED": "Topic authorization failed",
                  "GROUP_AUTHORIZATION_FAILED": "Group authorization failed",
                  "CLUSTER_AUTHORIZATION_FAILED": "Cluster authorization failed",
                  "SASL_AUTHENTICATION_FAILED": "SASL Authentication failed",
                  "_AUTHENTICATION": "Local: Authentication failure"}
# A staging task's error that waiting does not fix: its COPY's statement_timeout, its login or a grant refused
# (42501 on the staging schema or a table), Kafka's or the registry's refusal.
_READ_STOPS = (("canceling statement due to statement timeout", STATEMENT_TIMEOUT),
               ("password authentication failed", GRANT), ("no pg_hba.conf entry", GRANT),
               ("permission denied for", GRANT), ("must be owner of", GRANT),
               *((said, KAFKA_ACCESS) for said in KAFKA_REFUSALS.values()),
               ("schema registry answered 401", REGISTRY_ACCESS), ("schema registry answered 403", REGISTRY_ACCESS))
_BAD_DATA = Decision(Kind.OPERATOR, todo="more bad records than the spec's errors section allows: look at them (the "
                                         "message names their table); the next start plans a batch over "
                                         "errors.max_ratio again, and resumes one under errors.policy fail")
_SPEC_BY_SPARK = ("AnalysisException", "ParseException")  # Spark refused the spec's query: not Spark's outage


def sqlstate_decision(code: str, message: str = "", statement: str = "") -> Decision:
    """What a database error of SQLSTATE `code` (with its message and the statement that raised it) means."""
    if code == "57014" and (_CANCELED_BY_HAND in message or any(lock in statement for lock in _LOCK_WAITS)):
        return _outage(DATABASE, "a lock wait cut short by statement_timeout, or a statement canceled by hand")
    if code == "57014" and row_wait(message):
        return _outage(DATABASE, f"a wait for a row lock in {row_wait(message)} cut short by statement_timeout")
    if code == "53200" and "max_locks_per_transaction" in message:
        return Decision(Kind.OPERATOR, todo="raise max_locks_per_transaction (the batch needs more locks)")
    if row_error(code):
        return RECORD
    return SQLSTATES.get(code) or SQLSTATES.get(code[:2]) or _OTHER


def decide(exc: BaseException) -> Decision:
    """The one decision: what `exc` is (the record's fault, an outage, the operator's, a bug)."""
    if isinstance(exc, UnavailableError):  # source/kafka.py calls every KafkaException unreachable
        return _kafka_refused(str(exc)) or _outage(exc.dependency)
    if isinstance(exc, DBAPIError) or _is_psycopg2(exc):
        return _database(exc)
    if isinstance(exc, PoolTimeout):  # every pooled connection in use: the database's outage, waited out
        return _outage(DATABASE, "every pooled connection in use")
    from ledgerbatch.source.reader import RangeReadError

    if isinstance(exc, RangeReadError):
        return _kafka_refused(str(exc)) or (_outage("Kafka") if exc.retriable
                                            else Decision(Kind.OPERATOR, todo="Kafka refused the read"))
    if type(exc).__module__.startswith("cimpl") or type(exc).__name__ == "KafkaException":
        return _kafka(exc.args[0] if exc.args else None)
    if isinstance(exc, BatchFailedError):  # the attempt failed and is in the ledger; the next one takes over
        return _failed_read(str(exc))
    if isinstance(exc, LedgerbatchError):  # its message says what to do; a topic's metadata refused, Kafka's too
        return _kafka_refused(str(exc)) or Decision(Kind.OPERATOR)
    names = {c.__name__ for c in type(exc).__mro__}
    if type(exc).__module__.startswith(("pyspark.errors", "grpc", "py4j")):
        return Decision(Kind.OPERATOR, todo="fix the spec's transform") if names & set(_SPEC_BY_SPARK) \
            else _outage("Spark")
    return BUG


def _kafka_refused(text: str) -> Decision | None:
    return KAFKA_ACCESS if any(said in text for said in KAFKA_REFUSALS.values()) else None


def _kafka(error) -> Decision:
    """A librdkafka error (confluent_kafka.KafkaError): refused credentials or rights are the operator's, a
    retriable or transport error is Kafka's outage, anything else Kafka refused."""
    if error is None or not hasattr(error, "name"):
        return BUG
    if error.name() in KAFKA_REFUSALS:
        return KAFKA_ACCESS
    if not error.fatal() and (error.retriable() or error.name() in (
            "_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_RESOLVE", "LEADER_NOT_AVAILABLE",
            "NOT_LEADER_FOR_PARTITION", "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION")):
        return _outage("Kafka", error.str())
    return Decision(Kind.OPERATOR, todo=f"Kafka refused the request ({error.name()}: {error.str()})")


def row_wait(message: str) -> str | None:
    """The table whose row lock a statement was waiting for, as the error's context names it, if it was."""
    found = _ROW_WAIT.search(message)
    return found.group(1) if found else None


def lock_wait(decision: Decision, holders: list[str]) -> Decision:
    """A statement_timeout (57014) decided the operator's, given the sessions whose locks on the target conflict
    with a writer's as it failed (a reader's ACCESS SHARE does not: sql/queries/outages.sql): with any, the
    commit was waiting for them (a user's LOCK TABLE, an ALTER), which is the target's outage, waited out; with
    none, the statement itself was too slow for the timeout. The commit runs under a lock_timeout below the
    statement_timeout (commit/transaction.py), so a lock wait is mostly a 55P03 and this is the rest."""
    if decision is not STATEMENT_TIMEOUT or not holders:
        return decision
    return _outage(DATABASE, "the target's lock held by " + "; ".join(holders))


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


def stopped(exc: BaseException, pipeline: str, decision: Decision | None = None) -> LedgerbatchError | None:
    """The error a runner stops with for an error waiting cannot fix: a database error's reason, SQLSTATE and
    what to do; a refusal that crossed as text (a failed read, Kafka's) with what to do; None for any other
    error (it stops with its own message)."""
    decision = decision or decide(exc)
    if not (isinstance(exc, DBAPIError) or _is_psycopg2(exc)):
        if decision.kind is not Kind.OPERATOR or not decision.todo or not isinstance(
                exc, (LedgerbatchError, RuntimeError)) or decision.todo in str(exc):
            return None
        error = BatchFailedError if isinstance(exc, BatchFailedError) else LedgerbatchError
        return error(f"{pipeline}: stopped, {decision.kind.value}, not an outage: {_reason(exc)}; {decision.todo}")
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
    named = next((dependency for said, dependency in _READ_DEPENDENCIES if said in reason), None)
    return _outage(named) if named else Decision(Kind.OUTAGE, "Spark", presumed=True)


def _is_psycopg2(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("psycopg2")


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 1.0
    max_s: float = 60.0
    same_error_limit: int = 10  # a presumed outage's identical errors in a row that end a follower

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


SAME_ERROR = Decision(Kind.OPERATOR, todo=(
    "a dependency that answers does not fail the same way every time: the deployment or the spec does (a grant, "
    "a decoder, the transform, credentials); the batch's error is in ledger.batches (`ledgerbatch status`): fix "
    "it and start again, and the batch resumes with its ranges"))
# What differs between two tries of the same failure: the attempt's number (also in its staging table's name).
_TRY = re.compile(r"(attempt |_a)\d+")


class OutageRider(Outage):
    """A follower's outages, waited out with backoff: `wait` after an error a wait can fix."""

    def __init__(self, pipeline: str, stop: threading.Event, backoff: Backoff, counted=None):
        super().__init__(pipeline, counted)
        self.stop, self.backoff = stop, backoff
        self.same, self.repeats = "", 0

    def wait(self, decision: Decision, exc: BaseException, answering: Callable[[], bool] = lambda: False) -> None:
        """Wait before the next try; returns at once when `stop` is set (SIGTERM). A presumed outage whose error
        is the same `backoff.same_error_limit` times in a row while `answering()` (the database and Kafka answer)
        is not one: raises the error the follower stops with."""
        same = _TRY.sub(r"\1N", f"{type(exc).__name__}: {exc}") if decision.presumed else ""
        self.repeats = self.repeats + 1 if same and same == self.same else int(bool(same))
        self.same = same
        if self.repeats >= self.backoff.same_error_limit and answering():
            raise LedgerbatchError(
                f"{self.pipeline}: stopped, {SAME_ERROR.kind.value}, not an outage: the same error {self.repeats} "
                f"times in a row while the database and Kafka answer: {_reason(exc)}; {SAME_ERROR.todo}") from exc
        delay = self.backoff.delay(self.attempts)
        self.failed(decision.dependency, exc, f"trying again with backoff up to {self.backoff.max_s:g}s")
        self.stop.wait(delay)

    def ok(self) -> None:
        super().ok()
        self.same, self.repeats = "", 0


def _reason(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

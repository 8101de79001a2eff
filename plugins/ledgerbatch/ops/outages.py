"""Riding through outages in `run --follow`: which errors a wait can fix, and the wait.

A dependency that went away (the database restarting, failing over or read-only; every Kafka broker
down; the registry, Spark or its executors gone while a batch was read) is waited out with capped
exponential backoff and jitter, then the loop carries on where the ledger says: a batch whose
COMMIT's outcome was lost with the connection is committed or not in the ledger, and the next step reads
which. One line is logged when an outage starts and one when it ends, with how long it lasted, and
both are counted in the metrics. Everything else (a bad spec, a permission refused, offsets lost to
retention, a fenced or abandoned batch) is not an outage and still ends the run with its message.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from ledgerbatch.errors import BatchFailedError, UnavailableError

log = logging.getLogger(__name__)

# Server states a reconnect outlives: read-only (a standby not yet promoted), shutting down or starting up.
WAITABLE_SQLSTATES = {"25006", "57P01", "57P02", "57P03"}
DATABASE = "database"
# What a failed read's reason names (it crosses Spark as text); anything else is Spark's own trouble.
_READ_DEPENDENCIES = (("schema registry", "schema registry"), ("connection to server", DATABASE),
                      ("server closed the connection", DATABASE), ("Kafka", "Kafka"), ("rdkafka", "Kafka"))


def waitable(exc: BaseException) -> str | None:
    """The dependency an error says is away, or None where waiting cannot fix it."""
    if isinstance(exc, UnavailableError):
        return exc.dependency
    if isinstance(exc, DBAPIError):
        code = getattr(exc.orig, "pgcode", None) or ""
        if (exc.connection_invalidated or isinstance(exc, (OperationalError, InterfaceError))
                or code in WAITABLE_SQLSTATES or code.startswith("08")):
            return DATABASE
        return None
    if isinstance(exc, BatchFailedError):  # the attempt failed and is in the ledger; the next one takes over
        return next((dependency for said, dependency in _READ_DEPENDENCIES if said in str(exc)), "Spark")
    if type(exc).__module__.startswith(("pyspark.errors", "grpc", "py4j")):
        return "Spark"
    return None


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

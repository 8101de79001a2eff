"""The loops behind `ledgerbatch run` and `ledgerbatch replay`.

`run_pipeline`: plan, stage, commit until caught up (or N batches). With `follow_idle_s` the loop
never stops at caught up: it keeps its Spark session (the driver, the JVM and the Python workers stay
warm), plans again every `follow_idle_s` seconds until `stop` is set, and waits out its dependencies'
outages (ops/outages.py). Fencing is unchanged: every batch still goes through the ledger's attempts
and cursor CAS. What else a run does hangs off it as hooks (ops/hooks.py): a follower's warm-up, lag
for the metrics, lineage events, and the history upkeep the spec asks for with the partition bound.

`run_replay`: what the backfill DAG does, in one process.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from ledgerbatch import faults
from ledgerbatch.commit.modes.rollup import bound_partitions
from ledgerbatch.commit.diff import Diff, dry_run_diff
from ledgerbatch.commit.row_errors import sqlstate_of
from ledgerbatch.commit.transaction import CommitResult, commit_batch
from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.faults import crash_point
from ledgerbatch.identifiers import quote_ident
from ledgerbatch.model.batch import Batch, BatchStatus
from ledgerbatch.ops.events import phase_event
from ledgerbatch.ops.history import Upkeeper
from ledgerbatch.ops.hooks import Hooks
from ledgerbatch.ops.lag_sampler import LagSampler
from ledgerbatch.ops.lineage import Emitter
from ledgerbatch.ops.metrics import metrics
from ledgerbatch.ops.outages import Backoff, OutageRider, connection_lost, decide, lock_wait, row_wait, stopped
from ledgerbatch.ops.pause import pause_of
from ledgerbatch.ops.warm_start import WarmStart
from ledgerbatch.plan.live import plan_next
from ledgerbatch.plan.replay import ReplayRequest, plan_replay, resolve_ranges
from ledgerbatch.source import kafka
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.sqlfiles import query
from ledgerbatch.stage import stamps
from ledgerbatch.stage.process import process_batch
from ledgerbatch.stage.tables import drop_finished_staging
from ledgerbatch.stage.turns import Turns

log = logging.getLogger(__name__)
UPKEEP_EVERY_S = 60.0  # how often a following run compacts, purges and rolls up, as its spec asks


@dataclass
class RunSummary:
    batches: int = 0
    records_read: int = 0
    rows_written: int = 0
    rows_quarantined: int = 0
    rows_rejected: int = 0  # refused by the target at publish, kept in ledger.quarantine
    seconds: float = 0.0
    batch_ids: list[int] = field(default_factory=list)

    def add(self, batch: Batch, result: CommitResult) -> None:
        self.batches += 1
        self.batch_ids.append(batch.batch_id)
        self.records_read += batch.records_read
        self.rows_written += result.rows_written
        self.rows_quarantined += result.rows_quarantined
        self.rows_rejected += result.rows_rejected
        log.info("progress: %d batches, %d records read, %d rows written, %d quarantined, %d refused by the target (%s)",
                 self.batches, self.records_read, self.rows_written, self.rows_quarantined, self.rows_rejected,
                 "already committed" if result.already_committed else f"commit {result.seconds:.2f}s")


class Session:
    """The run's Spark session: made on first use (by the warm-up or the first batch to stage), made anew
    after Spark's outage (a restarted Spark Connect server). One may serve several runs in threads
    (ops/service.py), whose plain batches it then stages in turns of one Spark job (stage/turns.py)."""

    def __init__(self, factory: Callable, turns: Turns | None = None):
        self.factory, self.turns, self.spark, self._lock = factory, turns, None, threading.Lock()

    def __call__(self):
        with self._lock:
            if self.spark is None:
                self.spark = self.factory()
            return self.spark

    def drop(self, failed=None) -> None:
        """Forget the session `failed` on (by default the current one): made anew by the next use, once
        however many runs sharing it failed on it."""
        with self._lock:
            if failed is None or self.spark is failed:
                self.spark = None


def run_pipeline(engine: Engine, spec: PipelineSpec, db_url: str, bootstrap_servers: str,
                 spark_factory: Callable | Session, max_batches: int | None = None, follow_idle_s: float | None = None,
                 stop: threading.Event | None = None, backoff: Backoff = Backoff(),
                 upkeep_every_s: float = UPKEEP_EVERY_S) -> RunSummary:
    session = spark_factory if isinstance(spark_factory, Session) else Session(spark_factory)
    summary, started, idle = RunSummary(), time.monotonic(), False
    stop = stop or threading.Event()
    following = follow_idle_s is not None
    # In this order: lineage's COMPLETE comes before the partition bound is kept, upkeep before the lag look.
    hooks = Hooks(*([WarmStart(spec, bootstrap_servers)] if following else []), Emitter(spec, db_url, bootstrap_servers),
                  Upkeeper(engine, spec, upkeep_every_s), LagSampler(engine, spec, bootstrap_servers, following))
    # A follower waits out its dependencies' outages (ops/outages.py); a bounded run stops at the first.
    rider = OutageRider(spec.name, stop, backoff, metrics().outage) if following else None
    faults.arm()
    begun = False
    while not stop.is_set() and (max_batches is None or summary.batches < max_batches):
        used = session.spark  # the one a Spark outage below is about (another run may have renewed it since)
        try:
            if not begun:  # inside the outage handling: a follower started while the database or Spark is
                drop_finished_staging(engine, spec.name)  # away waits for it, as it would later
                hooks.started(session)
                begun = True
            hooks.between_batches()
            batch = plan(engine, spec, bootstrap_servers)
            if batch is None:
                if rider is not None:
                    rider.ok()
                if not idle:
                    _log_caught_up(engine, spec, follow_idle_s)
                if not following:
                    break
                idle = True
                stop.wait(follow_idle_s)
                continue
            idle = False
            with hooks.running(batch):  # lineage: START; FAIL if staging or the commit fails
                if batch.status != BatchStatus.STAGED:
                    batch = stage(session, engine, spec, batch, db_url, bootstrap_servers)
                result = commit(engine, spec, batch, following)
            hooks.committed(batch, result)
        except Exception as exc:
            if rider is None:
                raise
            holders = _lock_holders(engine, spec, exc) if sqlstate_of(exc) in ("57014", "55P03") else []
            decision = lock_wait(decide(exc), holders)
            if not decision.waitable:  # not an outage (ops/outages.py: decide): stop with the reason
                stop_with = stopped(exc, spec.name, decision)
                if stop_with is not None:
                    raise stop_with from exc
                raise
            if decision.dependency == "Spark":
                session.drop(used)
            if holders and decision.waitable:
                log.warning("%s: a lock wait was cut short (SQLSTATE %s), the lock held by %s: waiting for it",
                            spec.name, sqlstate_of(exc), "; ".join(holders))
            rider.wait(decision, exc, lambda: _answering(engine, spec, bootstrap_servers))
            continue
        if rider is not None:
            rider.ok()
        summary.add(batch, result)
    hooks.finished()
    summary.seconds = time.monotonic() - started
    return summary


def _lock_holders(engine: Engine, spec: PipelineSpec, exc: BaseException | None = None) -> list[str]:
    """The other sessions whose locks block a writer of the target (or a partition of it), and those that may
    hold the row lock the error's context names, just after a lock_timeout or a statement_timeout: who a
    commit cut short was waiting for, if anyone (ops/outages.py: lock_wait)."""
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(query("target_lock_holders")),
                                {"target": f"{quote_ident(spec.target_schema)}.{quote_ident(spec.target_table)}",
                                 "row_table": row_wait(str(getattr(exc, "orig", exc))) if exc else None})
            return [f"pid {r.pid} ({r.usename}, {r.mode}, {r.state}, in a transaction since {r.xact_start:%H:%M:%S}: "
                    f"{r.query})" for r in rows]
    except DBAPIError:  # the database went away meanwhile: the timeout is judged on its own
        return []


def _answering(engine: Engine, spec: PipelineSpec, bootstrap_servers: str) -> bool:
    """Whether the database and Kafka answer now (an error that repeats while they do is not their outage)."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        kafka.watermarks(bootstrap_servers, spec.topics, dict(spec.kafka_options))
    except Exception:  # noqa: BLE001  (any failure to answer: still waited out)
        return False
    return True


def plan(engine: Engine, spec: PipelineSpec, bootstrap_servers: str) -> Batch | None:
    """The next batch (one planned and left unfinished first), or None when caught up."""
    started = time.monotonic()
    with metrics().failures(spec.name, "plan"):
        batch = plan_next(engine, spec, bootstrap_servers)
    if batch is not None:
        phase_event("plan", batch, time.monotonic() - started)
        crash_point("after_plan")
    return batch


def stage(session: Session, engine: Engine, spec: PipelineSpec, batch: Batch, db_url: str,
          bootstrap_servers: str) -> Batch:
    """Stage the batch under a new attempt (the first batch's phase includes starting Spark)."""
    started = time.monotonic()
    with metrics().failures(spec.name, "process"):
        batch = process_batch(session(), engine, spec, batch.batch_id, db_url, bootstrap_servers, turns=session.turns)
    phase_event("process", batch, time.monotonic() - started)
    crash_point("after_stage")
    return batch


def commit(engine: Engine, spec: PipelineSpec, batch: Batch, following: bool) -> CommitResult:
    """Commit the staged batch. A bounded run that loses the database mid-commit stops with what to do; a
    follower waits for it, and the ledger then says whether the COMMIT landed."""
    started = time.monotonic()
    try:
        with metrics().failures(spec.name, "commit"):
            result = commit_batch(engine, spec, batch.batch_id, batch.attempt)
    except DBAPIError as exc:
        if following or not connection_lost(exc):
            raise
        # Whether the COMMIT landed is in the ledger: the next run reads it, never re-applies blindly.
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        raise LedgerbatchError(f"batch {batch.batch_id}: database connection lost during commit ({reason}); "
                               f"the ledger holds the outcome: run again to resume") from None
    phase_event("commit", batch, time.monotonic() - started, result.rows_written, result.rows_quarantined,
                committed_now=not result.already_committed, rows_rejected=result.rows_rejected)
    if not result.already_committed:
        metrics().freshness(spec.name, stamps.kept.take(batch.batch_id, batch.attempt), int(time.time() * 1000))
    return result


def _log_caught_up(engine: Engine, spec: PipelineSpec, follow_idle_s: float | None) -> None:
    pause = pause_of(engine, spec)
    log.info("%s: %s%s", spec.name, f"{pause}, nothing new is planned" if pause else "caught up, nothing to plan",
             f"; following, looking again every {follow_idle_s:g}s" if follow_idle_s is not None else "")


@dataclass(frozen=True)
class ReplayOutcome:
    batch: Batch  # as staged
    diff: Diff | None  # a dry run's
    committed: bool


def run_replay(engine: Engine, spec: PipelineSpec, request: ReplayRequest, db_url: str, bootstrap_servers: str,
               spark_factory, dry_run: bool) -> ReplayOutcome:
    """What the backfill DAG does, in one process: plan the replay or backfill batch, stage it, then
    commit it or (dry run) report the diff and abandon it. The live cursors never move."""
    batch = plan_replay(engine, spec, resolve_ranges(spec, bootstrap_servers, request))
    lineage = Emitter(spec, db_url, bootstrap_servers)
    with lineage.running(batch, enabled=not dry_run):  # a dry run delivers nothing: no lineage
        batch = process_batch(spark_factory(), engine, spec, batch.batch_id, db_url, bootstrap_servers)
        if dry_run:
            return ReplayOutcome(batch, dry_run_diff(engine, spec, batch.batch_id), False)
        result = commit_batch(engine, spec, batch.batch_id, batch.attempt)
    lineage.committed(batch, result)
    bound_partitions(engine, spec)  # a replay copied into a partition of its own may put the target over its bound
    return ReplayOutcome(batch, None, True)

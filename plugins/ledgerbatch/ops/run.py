"""The loops behind `ledgerbatch run` and `ledgerbatch replay`.

`run_pipeline`: plan, process, commit until caught up (or N batches). With `follow_idle_s` the loop
never stops at caught up: it keeps its Spark session (the driver, the JVM and the Python workers stay
warm), plans again every `follow_idle_s` seconds until `stop` is set, and waits out its dependencies'
outages (ops/outages.py). Fencing is unchanged: every batch still goes through the ledger's attempts
and cursor CAS.

Between batches it keeps history bounded as the spec asks (ops/history.py: compaction, quarantine
retention): when it starts, then every `upkeep_every_s` seconds; and an append target's partitions within
their bound after every commit (commit/modes/rollup.py).

`run_replay`: what the backfill DAG does, in one process.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from ledgerbatch import faults
from ledgerbatch.commit.diff import Diff, dry_run_diff
from ledgerbatch.commit.modes.rollup import bound_partitions
from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.faults import crash_point
from ledgerbatch.model.batch import Batch, BatchStatus
from ledgerbatch.ops.events import phase_event
from ledgerbatch.ops.history import Upkeeper
from ledgerbatch.ops.lineage import Emitter
from ledgerbatch.ops.metrics import metrics, record_lag
from ledgerbatch.ops.outages import Backoff, OutageRider, waitable
from ledgerbatch.ops.pause import pause_of
from ledgerbatch.plan.live import plan_next
from ledgerbatch.plan.replay import ReplayRequest, plan_replay, resolve_ranges
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.stage.process import process_batch
from ledgerbatch.stage.tables import drop_finished_staging
from ledgerbatch.stage.warm_up import warm_up

log = logging.getLogger(__name__)
LAG_EVERY_S = 5.0  # how often a following run measures its lag for the metrics (it reads Kafka)
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


def run_pipeline(engine: Engine, spec: PipelineSpec, db_url: str, bootstrap_servers: str,
                 spark_factory: Callable, max_batches: int | None = None, follow_idle_s: float | None = None,
                 stop: threading.Event | None = None, backoff: Backoff = Backoff(),
                 upkeep_every_s: float = UPKEEP_EVERY_S) -> RunSummary:
    summary, started, spark, idle, lag_at = RunSummary(), time.monotonic(), None, False, 0.0
    stop = stop or threading.Event()
    counted = partial(metrics().failures, spec.name)
    lineage = Emitter(spec, db_url, bootstrap_servers)
    upkeep = Upkeeper(engine, spec, upkeep_every_s)
    # A follower waits out its dependencies' outages (ops/outages.py); a bounded run stops at the first.
    rider = OutageRider(spec.name, stop, backoff, metrics().outage) if follow_idle_s is not None else None
    faults.arm()
    drop_finished_staging(engine, spec.name)
    if follow_idle_s is not None:  # be warm before the first batch arrives
        spark = spark_factory()
        warm = warm_up(spark, spec, bootstrap_servers)
        log.info("%s: Spark is up and its workers warm (%.1fs); following", spec.name, warm.seconds)
    while not stop.is_set() and (max_batches is None or summary.batches < max_batches):
        try:
            upkeep()
            if time.monotonic() - lag_at >= LAG_EVERY_S:
                record_lag(engine, spec, bootstrap_servers)
                lag_at = time.monotonic()
            phase_started = time.monotonic()
            with counted("plan"):
                batch = plan_next(engine, spec, bootstrap_servers)
            if batch is None:
                if rider is not None:
                    rider.ok()
                if not idle:
                    pause = pause_of(engine, spec)
                    log.info("%s: %s%s", spec.name, f"{pause}, nothing new is planned" if pause else
                             "caught up, nothing to plan",
                             f"; following, looking again every {follow_idle_s:g}s" if follow_idle_s is not None else "")
                if follow_idle_s is None:
                    break
                idle = True
                stop.wait(follow_idle_s)
                continue
            idle = False
            phase_event("plan", batch, time.monotonic() - phase_started)
            crash_point("after_plan")
            with lineage.running(batch):  # START; FAIL if staging or the commit fails
                if batch.status != BatchStatus.STAGED:
                    phase_started = time.monotonic()  # the first batch's process phase includes starting Spark
                    with counted("process"):
                        spark = spark or spark_factory()
                        batch = process_batch(spark, engine, spec, batch.batch_id, db_url, bootstrap_servers)
                    phase_event("process", batch, time.monotonic() - phase_started)
                    crash_point("after_stage")
                try:
                    phase_started = time.monotonic()
                    with counted("commit"):
                        result = commit_batch(engine, spec, batch.batch_id, batch.attempt)
                except DBAPIError as exc:
                    if rider is not None or not (exc.connection_invalidated
                                                 or isinstance(exc, (OperationalError, InterfaceError))):
                        raise  # a follower waits for the database; then the ledger says whether the COMMIT landed
                    # Whether the COMMIT landed is in the ledger: the next run reads it, never re-applies blindly.
                    reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
                    raise LedgerbatchError(f"batch {batch.batch_id}: database connection lost during commit ({reason}); "
                                           f"the ledger holds the outcome: run again to resume") from None
                phase_event("commit", batch, time.monotonic() - phase_started, result.rows_written,
                            result.rows_quarantined, committed_now=not result.already_committed,
                            rows_rejected=result.rows_rejected)
                lineage.emit("COMPLETE", batch, result.rows_written)
            bound_partitions(engine, spec)  # a batch attached as a partition may put the target over its bound
        except Exception as exc:
            dependency = waitable(exc) if rider is not None else None
            if dependency is None:
                raise
            if dependency == "Spark":
                spark = None  # a new session on the next try (a restarted Spark Connect server)
            rider.wait(dependency, exc)
            continue
        if rider is not None:
            rider.ok()
        summary.batches += 1
        summary.batch_ids.append(batch.batch_id)
        summary.records_read += batch.records_read
        summary.rows_written += result.rows_written
        summary.rows_quarantined += result.rows_quarantined
        summary.rows_rejected += result.rows_rejected
        log.info("progress: %d batches, %d records read, %d rows written, %d quarantined, %d refused by the target (%s)",
                 summary.batches, summary.records_read, summary.rows_written, summary.rows_quarantined,
                 summary.rows_rejected,
                 "already committed" if result.already_committed else f"commit {result.seconds:.2f}s")
    try:
        record_lag(engine, spec, bootstrap_servers)
    except Exception as exc:  # the last look at lag only feeds the metrics: an outage then changes nothing
        if rider is None or waitable(exc) is None:
            raise
    summary.seconds = time.monotonic() - started
    return summary


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
        lineage.emit("COMPLETE", batch, result.rows_written)
    return ReplayOutcome(batch, None, True)

"""Bounded history: `ledgerbatch compact`, `ledgerbatch quarantine purge`, and the upkeep a pipeline's spec
asks for (`history.compact_after`, `errors.quarantine_retention`, an append target's partition bound),
which `run` does when it starts and then every minute and the `ledgerbatch_history` DAG does daily. (The
partition bound is also kept after every commit: commit/modes/rollup.py, bound_partitions.)

Compaction and the rollup take the target's commit lock (commit/target.py: lock_target): commits into the
target wait for them, readers of the target and the ledger do not. Compaction folds in bounded steps
(STEP_BATCHES batches per transaction, the lock released between them), so a commit waits for one step.

Nothing of history stops a pipeline: each upkeep that fails, for whatever reason, gives way (logged once with
its reason, counted in `ledgerbatch_upkeep_failures_total`: ops/upkeep_failures.py), and the pipeline goes on
committing; it is tried again at the next turn, and the ledger keeps its last failure for `status`
(ops/upkeep_failures.py: record). Compaction folds up to the first unfinished batch: before it compacts, the
upkeep abandons the replays and backfills nobody will finish (ops/abandon.py: abandon_stranded), and a
compaction held back by an unfinished batch names it (and `status` shows it)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy.engine import Engine

from ledgerbatch.commit.modes.catalog import mode_for
from ledgerbatch.commit.modes.rollup import Rollup, bound_partitions
from ledgerbatch.commit.target import lock_target
from ledgerbatch.faults import terminate_point
from ledgerbatch.ledger import compaction
from ledgerbatch.ledger.sql import run
from ledgerbatch.ops.abandon import Stranded, abandon_stranded
from ledgerbatch.ops.hooks import RunHook
from ledgerbatch.ops.upkeep_failures import failing, giving_way, record
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.stage.tables import drop_finished_staging

log = logging.getLogger(__name__)


STEP_BATCHES = 200  # batches folded per step: what a commit may wait for (docs/benchmarks.md has its time)


@dataclass(frozen=True)
class Compacted:
    batches: int  # batches folded now
    through: int  # every batch of the pipeline up to this id is folded
    deletes: int  # ledger_deletes rows forgotten
    horizon: bool  # replays of the folded offsets are refused from now on
    seconds: float
    stopped_at: int | None = None  # an unfinished batch older than the cut-off that holds the fold back
    steps: int = 0  # transactions it folded in, each under the commit lock
    longest_step_s: float = 0.0  # the longest of them, from holding the locks to its COMMIT: what a commit may wait for


def compact(engine: Engine, spec: PipelineSpec, before: datetime, step_batches: int = STEP_BATCHES) -> Compacted:
    """Fold the pipeline's batches that finished before `before` (up to the first one that did not) into
    the checkpoints, at most `step_batches` batches per transaction. Each step takes the commit lock and
    releases it when it commits, so a commit waits for one step, never for the whole fold; each leaves the
    ledger exact, so a compaction stopped between steps (a crash, a lost connection) leaves a correct ledger
    and the next one goes on from there."""
    started = time.monotonic()
    drop_finished_staging(engine, spec.name)  # a folded batch's staging table would have no batch to name
    with engine.begin() as conn:  # what may fold: the batches up to it stay finished, so it is read once
        fold = compaction.foldable(conn, spec.name, before)
        stopped_at = _held_back_by(conn, spec, fold.through, before)
    batches, deletes, horizon, steps, longest = 0, 0, False, 0, 0.0
    while True:
        with engine.begin() as conn:
            lock_target(conn, spec)
            compaction.lock_compaction(conn, spec.name)
            step_started = time.monotonic()  # from here commits wait for it
            step = compaction.next_step(conn, spec.name, fold.through, step_batches)
            if step.empty:
                break
            forgotten, horizon = mode_for(spec).fold_history(conn, spec, step.through)
            batches += compaction.fold(conn, spec.name, step, forgotten, horizon)
            terminate_point(conn, "compaction_step")
            deletes += forgotten
        steps, longest = steps + 1, max(longest, time.monotonic() - step_started)
    if not steps:
        return Compacted(0, fold.folded, 0, False, time.monotonic() - started, stopped_at)
    compaction.vacuum(engine)
    done = Compacted(batches, fold.through, deletes, horizon, time.monotonic() - started, stopped_at, steps, longest)
    log.info("%s: compacted %d batches (through batch %d, finished before %s)%s%s in %.2fs, %d steps of at most "
             "%d batches (the longest %.3fs)", spec.name, batches, fold.through, before.isoformat(timespec="seconds"),
             f", forgot {deletes} deletes" if deletes else "",
             "; replays of the compacted offsets are refused from now on" if horizon else "", done.seconds, steps,
             step_batches, longest)
    return done


_NAMED: set[tuple[str, int]] = set()  # (pipeline, batch id) of the batches named as holding compaction back


def _held_back_by(conn, spec: PipelineSpec, through: int, before: datetime) -> int | None:
    """The batch after `through` when it is unfinished and older than the cut-off: what holds the fold back
    (a batch finished after the cut-off is where folding stops as it should). Named once per process."""
    first = run(conn, "first_batch_after", {"pipeline": spec.name, "batch_id": through}).first()
    if first is None or first.status not in ("planned", "staged", "failed") or first.updated_at >= before:
        return None
    if (spec.name, first.batch_id) not in _NAMED:
        _NAMED.add((spec.name, first.batch_id))
        then = ("`run` resumes it" if first.kind == "live" else
                "the upkeep abandons it once nobody holds it (a replay or backfill older than history.compact_after)"
                if spec.compact_after_s is not None else "`ledgerbatch abandon` gives it up if nobody will finish it")
        log.warning("%s: compaction stops before %s batch %d, %s at attempt %d since %s: it folds nothing after it "
                    "until that batch is committed or abandoned (%s)", spec.name, first.kind, first.batch_id,
                    first.status, first.attempt, first.updated_at.isoformat(timespec="seconds"), then)
    return first.batch_id


def purge_quarantine(engine: Engine, spec: PipelineSpec, before: datetime) -> int:
    """Delete the pipeline's bad records quarantined before `before`; `verify` keeps counting them."""
    with engine.begin() as conn:
        purged = compaction.purge_quarantine(conn, spec.name, before)
    if purged:
        compaction.vacuum(engine)
    log.info("%s: purged %d quarantined records older than %s", spec.name, purged, before.isoformat(timespec="seconds"))
    return purged


@dataclass(frozen=True)
class Upkeep:
    compacted: Compacted | None  # None: not asked for, or it gave way (gave_way names it)
    purged: int | None
    rollups: tuple[Rollup, ...]
    abandoned: tuple[Stranded, ...] = ()  # stranded replays and backfills abandoned before compacting
    gave_way: tuple[str, ...] = ()  # the upkeeps that failed this time (logged, counted; tried again next time)


def upkeep(engine: Engine, spec: PipelineSpec, now: datetime | None = None) -> Upkeep:
    """What the spec asks for, once: abandon the stranded replays and backfills older than
    history.compact_after and compact what is older than it, purge quarantine older than
    errors.quarantine_retention, merge partitions until the target is within its bound. Never raises for an
    upkeep that failed: it gives way (ops/upkeep_failures.py), and the others still run."""
    now = now or datetime.now(timezone.utc)
    compacted, purged, abandoned, failed = None, None, [], []
    if spec.compact_after_s is not None:
        before = now - timedelta(seconds=spec.compact_after_s)
        with giving_way(spec.name, "abandon_stranded") as outcome:
            abandoned = abandon_stranded(engine, spec, before)
        failed += ["abandon_stranded"] * outcome.failed
        with giving_way(spec.name, "compaction") as outcome:
            compacted = compact(engine, spec, before)
        failed += ["compaction"] * outcome.failed
    if spec.quarantine_retention_s is not None:
        with giving_way(spec.name, "purge") as outcome:
            purged = purge_quarantine(engine, spec, now - timedelta(seconds=spec.quarantine_retention_s))
        failed += ["purge"] * outcome.failed
    rollups = tuple(bound_partitions(engine, spec))  # gives way by itself (commit/modes/rollup.py)
    failed += ["rollup"] * ("rollup" in failing(spec.name))
    record(engine, spec.name)  # for `status` in any process
    return Upkeep(compacted, purged, rollups, tuple(abandoned), tuple(failed))


class Upkeeper(RunHook):
    """A run's upkeep: when it starts, then at most every `every_s` seconds, between batches; and an append
    target's partitions within their bound after every commit (a batch attached as a partition may put it over)."""

    def __init__(self, engine: Engine, spec: PipelineSpec, every_s: float):
        self.engine, self.spec, self.every_s, self.last = engine, spec, every_s, float("-inf")

    def between_batches(self) -> None:
        if time.monotonic() - self.last >= self.every_s:
            self.last = time.monotonic()
            upkeep(self.engine, self.spec)

    def committed(self, batch, result) -> None:
        bound_partitions(self.engine, self.spec)
        record(self.engine, self.spec.name)

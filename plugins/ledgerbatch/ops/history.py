"""Bounded history: `ledgerbatch compact`, `ledgerbatch quarantine purge`, and the upkeep a pipeline's spec
asks for (`history.compact_after`, `errors.quarantine_retention`, an append target's partition bound),
which `run` does when it starts and then every minute and the `ledgerbatch_history` DAG does daily. (The
partition bound is also kept after every commit: commit/modes/rollup.py, bound_partitions.)

Compaction and the rollup take the target's commit lock (commit/target.py: lock_target): commits into the
target wait for them, readers of the target and the ledger do not."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy.engine import Engine

from ledgerbatch.commit.modes.catalog import mode_for
from ledgerbatch.commit.modes.rollup import Rollup, bound_partitions
from ledgerbatch.commit.target import lock_target
from ledgerbatch.ledger import compaction
from ledgerbatch.ops.hooks import RunHook
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.stage.tables import drop_finished_staging

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Compacted:
    batches: int  # batches folded now
    through: int  # every batch of the pipeline up to this id is folded
    deletes: int  # ledger_deletes rows forgotten
    horizon: bool  # replays of the folded offsets are refused from now on
    seconds: float


def compact(engine: Engine, spec: PipelineSpec, before: datetime) -> Compacted:
    """Fold the pipeline's batches that finished before `before` (up to the first one that did not) into
    the checkpoints, in one transaction."""
    started = time.monotonic()
    drop_finished_staging(engine, spec.name)  # a folded batch's staging table would have no batch to name
    with engine.begin() as conn:
        lock_target(conn, spec)
        compaction.lock_compaction(conn, spec.name)
        fold = compaction.foldable(conn, spec.name, before)
        if fold.empty:
            return Compacted(0, fold.folded, 0, False, time.monotonic() - started)
        deletes, horizon = mode_for(spec).fold_history(conn, spec, fold.through)
        batches = compaction.fold(conn, spec.name, fold, deletes, horizon)
    compaction.vacuum(engine)
    done = Compacted(batches, fold.through, deletes, horizon, time.monotonic() - started)
    log.info("%s: compacted %d batches (through batch %d, finished before %s)%s%s in %.2fs", spec.name, batches,
             fold.through, before.isoformat(timespec="seconds"), f", forgot {deletes} deletes" if deletes else "",
             "; replays of the compacted offsets are refused from now on" if horizon else "", done.seconds)
    return done


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
    compacted: Compacted | None
    purged: int | None
    rollups: tuple[Rollup, ...]


def upkeep(engine: Engine, spec: PipelineSpec, now: datetime | None = None) -> Upkeep:
    """What the spec asks for, once: compact what is older than history.compact_after, purge quarantine older
    than errors.quarantine_retention, merge partitions until the target is within its bound."""
    now = now or datetime.now(timezone.utc)
    compacted = (compact(engine, spec, now - timedelta(seconds=spec.compact_after_s))
                 if spec.compact_after_s is not None else None)
    purged = (purge_quarantine(engine, spec, now - timedelta(seconds=spec.quarantine_retention_s))
              if spec.quarantine_retention_s is not None else None)
    return Upkeep(compacted, purged, tuple(bound_partitions(engine, spec)))


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

"""Keeping an append target's partitions bounded: a run of adjacent closed partitions of like sizes merges
into one (partitions.py: plan_rollup) when there are more than `target.partitions.max`.

Online: the rows are copied into a new table beside the target while readers go on (writers of the merged
partitions wait); then one brief swap detaches them and attaches the copy, under a lock timeout so that a
long query on the target makes the rollup give way (and try again later) rather than queue readers behind it.
Commits into the target wait for the rollup (commit/target.py: lock_target).

The merged partition holds the target's rows as they are: a CHECK the target has NOT VALID (added so as not to
judge its history) is added to it NOT VALID after the copy, as the target has it. A rollup that fails anyway,
for whatever reason (a foreign key that references the target, a view on one of its partitions, a lock or
statement timeout, a privilege), gives way: it is rolled back, logged once with its reason and counted
(ops/upkeep_failures.py, `ledgerbatch_upkeep_failures_total`), the target stays over its bound, and commits go on;
a commit or upkeep after a short rest (5 s, doubling up to 5 minutes while it keeps failing) tries again."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ledgerbatch.commit.modes.append import partition_name, partitions_of
from ledgerbatch.commit.modes.base import target_names
from ledgerbatch.commit.modes.partitions import MAX_PARTITIONS, plan_rollup
from ledgerbatch.commit.target import lock_target, table_exists
from ledgerbatch.identifiers import quote_ident
from ledgerbatch.ops.upkeep_failures import giving_way, resting
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.sqlfiles import Fragment, query

log = logging.getLogger(__name__)
SWAP_LOCK_TIMEOUT = "5s"


@dataclass(frozen=True)
class Rollup:
    merged: tuple[str, ...]  # the partitions that were merged
    into: str
    lower: int
    upper: int
    partitions: int  # the target's partitions afterwards
    seconds: float


def roll_up(engine: Engine, spec: PipelineSpec) -> Rollup | None:
    """Merge one run of partitions if the target has more than allowed; None when within bounds, not
    partitioned, or when the rollup failed and gave way (a reader held the target past the swap's lock
    timeout, the target's own rules refused it...: logged and counted; the next call tries again)."""
    started = time.monotonic()
    done = None
    with giving_way(spec.name, "rollup") as outcome:
        with engine.begin() as conn:
            done = _roll_up(conn, spec)
    if outcome.failed or done is None:
        return None
    rollup = Rollup(*done, seconds=time.monotonic() - started)
    log.info("%s: merged %d partitions of %s.%s into %s (batches [%d, %d)) in %.2fs; %d partitions", spec.name,
             len(rollup.merged), spec.target_schema, spec.target_table, rollup.into, rollup.lower, rollup.upper,
             rollup.seconds, rollup.partitions)
    return rollup


def bound_partitions(engine: Engine, spec: PipelineSpec) -> list[Rollup]:
    """Roll up until the target is within its bound, or until a rollup gives way; what `run` does after each
    commit, as the Airflow commit task does (a catalog look, a few milliseconds, when nothing is over). Never
    raises for a rollup that failed (roll_up). After rollups that failed, it leaves the target alone for a
    while (5 s, doubling to at most 5 minutes: ops/upkeep_failures.py, resting) rather than copy the same
    partitions again after every commit."""
    done = []
    if (rest := resting(spec.name, "rollup")) > 0:
        log.debug("%s: partition rollup failed the last time; tried again in %.0fs", spec.name, rest)
        return done
    while spec.mode == "append" and (rollup := roll_up(engine, spec)) is not None:
        done.append(rollup)
    return done


def _roll_up(conn: Connection, spec: PipelineSpec):
    if spec.mode != "append" or not table_exists(conn, spec.target_schema, spec.target_table):
        return None
    bound = spec.max_partitions or MAX_PARTITIONS
    if not plan_rollup(partitions_of(conn, spec), bound):
        return None  # within bounds: the look took no lock
    lock_target(conn, spec)
    existing = partitions_of(conn, spec)
    run = plan_rollup(existing, bound)
    if not run:
        return None
    target, lower, upper = target_names(spec), run[0].lower, run[-1].upper
    merged = f"lb_rollup_{lower}"  # beside the target until it takes the first partition's name
    conn.execute(text(query("create_merged_partition", merged=merged, **target)), {"lower": lower, "upper": upper})
    unjudged = [c for c in conn.execute(text(query("table_checks")), target) if c.definition.endswith(" NOT VALID")]
    for check in unjudged:  # LIKE made it a validated CHECK: it would judge the rows the target holds already
        conn.execute(text(query("drop_merged_check", merged=merged, constraint=check.name, **target)))
    columns = Fragment(", ".join(quote_ident(r.column_name) for r in conn.execute(text(query("table_columns")), target)
                                 if not r.generated))
    for p in run:
        conn.execute(text(query("hold_partition", partition=p.name, **target)))
        conn.execute(text(query("copy_partition", merged=merged, partition=p.name, columns=columns, **target)))
    for check in unjudged:  # as the target has it (ATTACH requires it), judging rows written from now on
        conn.execute(text(query("add_check", schema=target["schema"], table=merged, constraint=check.name,
                                definition=Fragment(check.definition))))
    conn.execute(text(query("set_lock_timeout")), {"ms": SWAP_LOCK_TIMEOUT})
    for p in run:
        conn.execute(text(query("drop_partition", partition=p.name, **target)))
    into = partition_name(spec.target_table, lower)
    conn.execute(text(query("attach_merged_partition", merged=merged, partition=into, **target)),
                 {"lower": lower, "upper": upper})
    return tuple(p.name for p in run), into, lower, upper, len(existing) - len(run) + 1

"""Keeping an append target's partitions bounded: a run of adjacent closed partitions of like sizes merges
into one (partitions.py: plan_rollup) when there are more than `target.partitions.max`.

Online, and commits never wait for the copy. One rollup of a target at a time (a session lock that commits never
take). The target's shape is taken into a temporary table in a short transaction of its own, and the table that
takes the rows is made from it, so that the copy holds no lock on the target itself (LIKE takes one until its
transaction ends; a commit that attaches a big batch detaches the open partition and would wait for it), and a
rollup whose process dies leaves nothing behind. The copy's transaction holds the merged partitions in
SHARE mode (without waiting: NOWAIT) from the copy to the swap: they are closed to live batches, which go to newer
partitions; their writers (a replay removing rows it replaces, a purge, a user's UPDATE) wait for the rollup, so no
row changes between the copy and the swap, and the rollup gives way to them at once: a watchdog (its own
connection, rollup_watchdog.py) cancels the rollup's statement, the copy too, within WATCH_S of anybody waiting
for one of its locks, and the rollup looks itself between its steps. Only the swap (detach and drop the old,
attach the copy: metadata only) takes the commit lock (commit/target.py: lock_target), and only by polling for
it, so a commit never waits while the rollup waits for something else. The swap's table locks wait at most
SWAP_LOCK_TIMEOUT for a query holding the target; a writer that holds the target and waits for a merged partition
(a user's UPDATE) would deadlock with the swap's DETACH, and the watchdog cancels the rollup first (within
WATCH_S of the writer's wait, where PostgreSQL looks for deadlocks after deadlock_timeout, 1 s by default).

Readers' snapshots: the copied rows carry the rollup's transaction, so a snapshot taken before the rollup commits
would not see them, nor the dropped partitions. Before the copy and again before the swap the rollup waits (at
most SNAPSHOT_WAIT_S) until every other snapshot of the database open at that moment has ended, and after the
swap it gives way if any backend waits for the locks it holds (a reader of the target that took its snapshot
before). What remains, docs/pipeline-spec.md says: a REPEATABLE READ transaction that takes its snapshot during
the swap's few milliseconds and first reads the target after it.

The merged partition holds the target's rows as they are: a CHECK the target has NOT VALID (added so as not to
judge its history) is added to it NOT VALID after the copy, as the target has it. A rollup that fails or gives
way, for whatever reason (a foreign key that references the target, a view on one of its partitions, a lock or
statement timeout, a privilege, an old snapshot, a waiting writer), is rolled back (its copy with it), logged once
with its reason and counted (ops/upkeep_failures.py, `ledgerbatch_upkeep_failures_total`), the target stays over
its bound, and commits go on; a commit or upkeep after a short rest (5 s, doubling up to 5 minutes while it keeps
failing) tries again."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from ledgerbatch.commit.modes.append import partition_name, partitions_of
from ledgerbatch.commit.modes.base import target_names
from ledgerbatch.commit.modes.partitions import MAX_PARTITIONS, Partition, plan_rollup
from ledgerbatch.commit.modes.rollup_watchdog import Watchdog, watching
from ledgerbatch.commit.target import table_exists
from ledgerbatch.errors import LedgerbatchError
from ledgerbatch.faults import terminate_point
from ledgerbatch.identifiers import quote_ident
from ledgerbatch.ops.upkeep_failures import giving_way, resting
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.sqlfiles import Fragment, query

log = logging.getLogger(__name__)
SWAP_LOCK_TIMEOUT = "1s"  # a query holding the target delays the swap, and the commits behind it, at most this long
COMMIT_LOCK_WAIT_S = 5.0  # polling for the commit lock while commits come and go
SNAPSHOT_WAIT_S = 5.0  # for the snapshots open before the copy, and before the swap, to end
POLL_S = 0.01
ROLLUP_TEMPLATE = "lb_rollup_shape"  # the target's shape, a temporary table of the rollup's session


class RollupGaveWay(LedgerbatchError):
    """The rollup stood aside for a commit, a writer or a reader; counted like a lock timeout."""
    pgcode = "55P03"  # lock_not_available: what ops/upkeep_failures.py reports as its SQLSTATE


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
    partitioned, when another rollup of the target runs, or when the rollup failed and gave way (a reader held
    the target past the swap's lock timeout, an older snapshot stayed open, the target's own rules refused it...:
    logged and counted; the next call tries again)."""
    started = time.monotonic()
    done = None
    with giving_way(spec.name, "rollup") as outcome:
        done = _roll_up(engine, spec)
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


def _roll_up(engine: Engine, spec: PipelineSpec):
    if spec.mode != "append":
        return None
    target = target_names(spec)
    lock = {"target": f"{spec.target_schema}.{spec.target_table}"}
    bound = spec.max_partitions or MAX_PARTITIONS
    with engine.connect() as conn:
        with conn.begin():  # the look takes no lock
            if not (table_exists(conn, spec.target_schema, spec.target_table)
                    and plan_rollup(partitions_of(conn, spec), bound)
                    and conn.execute(text(query("rollup_lock")), lock).scalar_one()):
                return None
        try:
            return _merge(conn, spec, target, lock, bound)
        finally:
            try:
                with conn.begin():
                    conn.execute(text(query("rollup_unlock")), lock)
            except Exception:
                conn.invalidate()  # a pooled connection must not keep the rollup lock
                raise


def _merge(conn: Connection, spec: PipelineSpec, target: dict, lock: dict, bound: int):
    """Under the rollup lock: take the target's shape (its own transaction), then copy and swap in another."""
    template = {"template": ROLLUP_TEMPLATE}
    with conn.begin():
        run = plan_rollup(partitions_of(conn, spec), bound)  # closed partitions change only by a rollup
        if not run:
            return None
        conn.execute(text(query("create_rollup_template", **template, **target)))
        unjudged = [c for c in conn.execute(text(query("table_checks")), target)
                    if c.definition.endswith(" NOT VALID")]
        for check in unjudged:  # LIKE made it a validated CHECK: it would judge the rows the target holds already
            conn.execute(text(query("drop_merged_check", schema="pg_temp", merged=ROLLUP_TEMPLATE,
                                    constraint=check.name)))
        columns = Fragment(", ".join(quote_ident(r.column_name) for r in conn.execute(text(query("table_columns")),
                                                                                      target) if not r.generated))
        oid = conn.execute(text(query("table_oid")), target).scalar_one()
    lower, upper = run[0].lower, run[-1].upper
    merged = f"lb_rollup_{oid}_{lower}"  # beside the target until it takes the first partition's name
    watchdog = None
    try:
        try:
            with conn.begin():
                conn.execute(text(query("create_merged_partition", merged=merged, **template, **target)),
                             {"lower": lower, "upper": upper})
                with watching(conn) as watchdog:  # stopped before the transaction ends
                    _copy_and_swap(conn, spec, target, lock, run, merged, unjudged, columns)
        except DBAPIError as exc:
            if getattr(exc.orig, "pgcode", None) != CANCELLED or not _cancelled(conn, spec, lower, upper, watchdog):
                raise
        with conn.begin():
            partitions = len(partitions_of(conn, spec))
    finally:
        with conn.begin():
            conn.execute(text(query("drop_rollup_template", **template)))
    return tuple(p.name for p in run), partition_name(spec.target_table, lower), lower, upper, partitions


CANCELLED = "57014"  # query_canceled: by the watchdog, or a statement_timeout


def _cancelled(conn: Connection, spec: PipelineSpec, lower: int, upper: int, watchdog: Watchdog | None) -> bool:
    """A statement of the copy-and-swap transaction, or its COMMIT, was cancelled: True when the swap committed
    nevertheless (a cancel that reached COMMIT too late: the catalog has the merged partition); RollupGaveWay when
    the watchdog cancelled it; False for another cancel (raised as it is)."""
    with conn.begin():
        if any(p.lower == lower and p.upper == upper for p in partitions_of(conn, spec)):
            return True
    if watchdog is not None and watchdog.cancelled:
        raise RollupGaveWay("a backend waited for a lock the rollup holds: its watchdog cancelled the rollup")
    return False


def _copy_and_swap(conn: Connection, spec: PipelineSpec, target: dict, lock: dict, run: list[Partition],
                   merged: str, unjudged: list, columns: Fragment) -> None:
    held = Fragment(", ".join(f"{quote_ident(target['schema'])}.{quote_ident(p.name)}" for p in run))
    conn.execute(text(query("hold_partitions", partitions=held)))  # a writer holds one: 55P03, the rollup gives way
    _await_snapshots(conn, "the copy")  # an old snapshot that stays open would make the copy useless
    for p in run:
        conn.execute(text(query("copy_partition", merged=merged, partition=p.name, columns=columns, **target)))
    for check in unjudged:  # as the target has it (ATTACH requires it), judging rows written from now on
        conn.execute(text(query("add_check", schema=target["schema"], table=merged, constraint=check.name,
                                definition=Fragment(check.definition))))
    _await_snapshots(conn, "the swap")
    _await_commit_lock(conn, lock)
    conn.execute(text(query("set_lock_timeout")), {"ms": SWAP_LOCK_TIMEOUT})
    for p in run:
        conn.execute(text(query("drop_partition", partition=p.name, **target)))
    conn.execute(text(query("attach_merged_partition", merged=merged, partition=partition_name(
        spec.target_table, run[0].lower), **target)), {"lower": run[0].lower, "upper": run[-1].upper})
    if _waiting_on_me(conn):  # e.g. a REPEATABLE READ reader that took its snapshot before, blocked by the swap
        raise RollupGaveWay("a reader of the target waits for the swap: its snapshot would not see the merged rows")
    terminate_point(conn, "rollup_swap")


def _await_snapshots(conn: Connection, before: str) -> None:
    """Wait until every other snapshot open now has ended (a snapshot that ends and a new one with the same xmin
    in the same backend count as one: waited for longer, never less); give way at once to a backend waiting for
    a lock the rollup holds, and after SNAPSHOT_WAIT_S to the snapshots still open."""
    open_now = _open_snapshots(conn)
    deadline = time.monotonic() + SNAPSHOT_WAIT_S
    while open_now:
        if _waiting_on_me(conn):
            raise RollupGaveWay(f"a writer of a merged partition waits for the rollup (before {before})")
        if time.monotonic() > deadline:
            raise RollupGaveWay(f"snapshots older than the rollup stayed open past {SNAPSHOT_WAIT_S:.0f}s (before "
                                f"{before}; backends {sorted(pid for pid, _ in open_now)}): they would not see "
                                f"the merged rows")
        time.sleep(POLL_S)
        open_now &= _open_snapshots(conn)


def _open_snapshots(conn: Connection) -> set[tuple[int, str]]:
    conn.execute(text(query("fresh_activity")))
    return {(r.pid, r.xmin) for r in conn.execute(text(query("open_snapshots")))}


def _await_commit_lock(conn: Connection, lock: dict) -> None:
    deadline = time.monotonic() + COMMIT_LOCK_WAIT_S
    while not conn.execute(text(query("try_target_lock")), lock).scalar_one():
        if _waiting_on_me(conn):
            raise RollupGaveWay("a commit waits for a merged partition: the rollup stands aside")
        if time.monotonic() > deadline:
            raise RollupGaveWay(f"commits held the target's commit lock for {COMMIT_LOCK_WAIT_S:.0f}s")
        time.sleep(POLL_S)


def _waiting_on_me(conn: Connection) -> bool:
    conn.execute(text(query("fresh_activity")))
    return conn.execute(text(query("waiting_on_rollup"))).scalar_one() > 0

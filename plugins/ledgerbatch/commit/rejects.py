"""Rows the target refuses at publish (`errors.on_reject: quarantine`), found inside the commit's transaction.

The batch is published in a savepoint. Where the server refuses a row (commit/row_errors.py decides which
errors are a row's: a data exception or an integrity violation, SQLSTATE classes 22 and 23; a program
limit such as a key too long for a btree index, class 54; a trigger's RAISE, class P0, or a code of the
trigger's own such as 'LB001'), the staged rows are numbered in the mode's order and probed: a run of rows
is published in a savepoint of its own and kept if the server takes it. Where the refusal names a CHECK or
NOT NULL, the rows that break it come from one scan with the server's own definition, each confirmed by a
probe of its own (k probes for k rows); otherwise runs are halved down to single rows, which are the
refused ones (O(k log n) probes). A clean batch pays one savepoint. The probes are then rolled back, the
refused rows moved from staging to ledger.quarantine with the server's reason, and the rest published
once, as a clean batch is (an append target may still take the staging table as a partition: it holds
no refused row; but where the ATTACH would build an index, the rows are copied instead: the removed rows'
versions stay in the staging table until the commit, and the index build would take them too). Rows
are judged together with the rows published before them, so a row the rest of the batch makes
unacceptable (a duplicate of a user's unique index) is found as well; a final publish that is still
refused goes round again, each round taking at least one row out.

Deferred constraints (`DEFERRABLE INITIALLY DEFERRED` foreign keys and uniques) are checked at each
statement while the batch is published and probed (SET CONSTRAINTS ALL IMMEDIATE), so what they refuse
is a refused row too, never a COMMIT or an ATTACH that fails for the whole batch on every retry; they are
deferred again after the publish.

Any other error (connection lost, deadlock, serialization failure, lock timeout, statement timeout, disk
full, permission denied) is the server's state, not the row's: it fails the batch, which is retried;
nothing is quarantined.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from typing import Callable

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ledgerbatch.commit.modes.base import TargetMode
from ledgerbatch.commit.row_errors import refused_row
from ledgerbatch.errors import LedgerbatchError, RowsRefusedError
from ledgerbatch.identifiers import quote_ident
from ledgerbatch.ledger.batches import record_set_aside
from ledgerbatch.ledger.quarantine import quarantine_refused
from ledgerbatch.model.batch import Batch
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.sqlfiles import Fragment, query
from ledgerbatch.stage.tables import StagingTables

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refusal:
    unit: int  # the row's number in the units table
    sqlstate: str
    constraint: str | None
    message: str  # the server's reason, without its DETAIL: what logs and the ledger's readers see
    column: str | None = None  # the column a NOT NULL refusal names
    detail: str | None = None  # the row's values ("Failing row contains (...)"): kept apart, in the quarantine only


@dataclass(frozen=True)
class Published:
    removed: int  # what a replay's publish removed of earlier deliveries (TargetMode.publish)
    rejected: int  # rows refused and quarantined (the ledger's counts moved: record_set_aside)


def publish_or_reject(conn: Connection, mode: TargetMode, spec: PipelineSpec, shape: BatchShape,
                      batch: Batch) -> Published:
    """Publish the batch; with `errors.on_reject: quarantine` move the rows the target refuses to quarantine
    first. Under `fail` the batch fails naming a refused record; where rows are not records (aggregate
    groups) it fails naming the group's refusal. Either way nothing is written and the batch stays staged."""
    conn.execute(text(query("constraints_immediate")))
    publish = functools.partial(mode.publish, conn, spec, shape, batch)  # all staged rows, or rows= a run of them
    rejected = 0
    while True:
        try:
            with conn.begin_nested():
                removed = publish() or 0
            conn.execute(text(query("constraints_restored")))
            return Published(removed, rejected)
        except DBAPIError as exc:
            if not refused_row(exc):
                raise
            first = _reason(exc)
            if not mode.rows_are_records:
                raise RowsRefusedError(_group_report(batch, first)) from None
            log.warning("batch %d: the target refused a row (%s): finding the refused rows", batch.batch_id,
                        first.message)
        names = {"staging": batch.staging_table, "units": f"{batch.staging_table}_units",
                 "slice": f"{batch.staging_table}_slice"}
        refused, total = _find_refused(conn, mode, publish, spec, batch, names, first)
        if spec.on_reject == "fail":
            raise RowsRefusedError(_refusal_report(conn, batch, names, refused, total))
        rejected += _quarantine(conn, spec, batch, names, refused, total)


def _find_refused(conn: Connection, mode: TargetMode, publish: Callable, spec: PipelineSpec, batch: Batch,
                  names: dict, first: Refusal) -> tuple[list[Refusal], int]:
    """Number the staged rows, then find the refused ones: by the refused CHECK or NOT NULL itself where the
    first refusal names one (the rows that break it, each confirmed by a probe of its own), else by bisection.
    Returns them and how many rows there are."""
    columns = Fragment(", ".join(quote_ident(c) for c in StagingTables(batch.staging_table).columns(conn)))
    total = conn.execute(text(query("number_units", order=Fragment(mode.unit_order(spec)), **names))).rowcount
    conn.execute(text(query("index_units", **names)))
    conn.execute(text(query("slice_view", columns=columns, **names)))
    with conn.begin_nested() as probes:
        # An empty run first: what every publish of the batch does besides its rows (a replay's removals, a
        # new partition of an append target) is done once, not again by every probe.
        conn.execute(text(query("set_slice")), {"first": "1", "last": "0"})
        publish(rows=names["slice"])
        refused = _breaking(conn, publish, spec, batch, names, first) or _bisect(conn, publish, batch, names["slice"],
                                                                               total)
        # named as the user declared them, while the probes' partitions (which may name them) still exist
        declared = {name: conn.execute(text(query("declared_constraint")), {"name": name, "schema": spec.target_schema})
                    .scalar_one() for name in {r.constraint for r in refused if r.constraint}}
        probes.rollback()  # the probes only judged the rows: the batch is published once, after them
    return [replace(r, constraint=declared.get(r.constraint)) for r in refused], total


def _breaking(conn: Connection, publish: Callable, spec: PipelineSpec, batch: Batch, names: dict,
              first: Refusal) -> list[Refusal]:
    """The rows that break the CHECK or NOT NULL the first refusal named, found in one scan and each
    confirmed by publishing it alone (a row the scan misjudges is left to the next round). A batch with k
    such rows costs k probes instead of O(k log n). Others, or a scan the server cannot run: none, and
    bisection finds them."""
    if first.sqlstate == "23514" and first.constraint:
        checks = {c.name: c.definition for c in conn.execute(text(query("table_checks")),
                                                             {"schema": spec.target_schema, "table": spec.target_table})}
        definition = checks.get(first.constraint, "")
        if not definition.startswith("CHECK ") or definition.endswith(" NO INHERIT"):
            return []
        breaks = Fragment(f"({definition.removeprefix('CHECK ').removesuffix(' NOT VALID')}) IS FALSE")
    elif first.sqlstate == "23502" and first.column:
        breaks = Fragment(f"{quote_ident(first.column)} IS NULL")
    else:
        return []
    try:  # only a shortcut: a CHECK over a column staging lacks, or one that raises on a row, is bisected
        with conn.begin_nested():
            units = conn.execute(text(query("breaking_units", breaks=breaks, **names))).all()
    except DBAPIError as exc:
        log.info("batch %d: the scan for rows breaking %s failed (%s): bisecting instead", batch.batch_id,
                 first.constraint or first.column, _reason(exc).message)
        return []
    refused = []
    for (unit,) in units:
        refusal = _probe(conn, publish, names["slice"], unit, unit)
        if refusal is not None:
            refused.append(replace(refusal, unit=unit))
    return refused


def _probe(conn: Connection, publish: Callable, slice_view: str, first: int, last: int) -> Refusal | None:
    """Publish rows first..last through `slice_view` in a savepoint of their own, kept where the server takes
    them; the server's refusal where it refuses a row. Any other error fails the batch."""
    conn.execute(text(query("set_slice")), {"first": str(first), "last": str(last)})
    try:
        with conn.begin_nested():
            publish(rows=slice_view)
        return None
    except DBAPIError as exc:
        if not refused_row(exc):
            raise
        return _reason(exc)


def _quarantine(conn: Connection, spec: PipelineSpec, batch: Batch, names: dict, refused: list[Refusal],
                total: int) -> int:
    """Move the refused rows to quarantine and out of staging, and count them in the ledger. Returns how
    many."""
    units = [r.unit for r in refused]
    quarantine_refused(conn, names["units"], batch.batch_id, spec.name, refused)
    is_delete = Fragment("_change = 'd'" if spec.changes else "false")
    by_range = conn.execute(text(query("rejected_by_range", is_delete=is_delete, **names)), {"units": units}).all()
    conn.execute(text(query("delete_rejected", **names)), {"units": units, "staging": batch.staging_table})
    conn.execute(text(query("drop_units", **names)))
    rows, deletes = sum(r.rows for r in by_range), sum(r.deletes for r in by_range)
    record_set_aside(conn, batch.batch_id, "rejected", {(r.topic, r.partition): r.rows for r in by_range}, deletes)
    log.warning("batch %d: %d of %d staged rows refused by the target and quarantined (%s)", batch.batch_id,
                rows, total, ", ".join(sorted({f"{r.sqlstate} {r.constraint or ''}".strip() for r in refused})))
    return rows


def _refusal_report(conn: Connection, batch: Batch, names: dict, refused: list[Refusal], total: int) -> str:
    first = refused[0]
    at = conn.execute(text(query("unit_coordinates", **names)), {"unit": first.unit}).one()
    return (f"batch {batch.batch_id}: the target refused {len(refused)} of {total} rows, the first "
            f"{at.topic}[{at.partition}] offset {at.offset}: {first.message} (SQLSTATE {first.sqlstate}"
            f"{', constraint ' + first.constraint if first.constraint else ''}); errors.on_reject is fail, so nothing "
            f"was written: fix the records or the target and run again, or set errors.on_reject: quarantine")


def _group_report(batch: Batch, refusal: Refusal) -> str:
    return (f"batch {batch.batch_id}: the target refused a group: {refusal.message} (SQLSTATE {refusal.sqlstate}"
            f"{', constraint ' + refusal.constraint if refusal.constraint else ''}). A group stands for many records, "
            f"so it cannot be quarantined: nothing was written and the batch stays staged; change the target's rule "
            f"or the query, then run again (the staged batch commits)")


def _bisect(conn: Connection, publish: Callable, batch: Batch, slice_view: str, total: int) -> list[Refusal]:
    """Publish rows 1..total in runs through `slice_view`, each kept where the server takes it, halved where
    it refuses."""
    refused: list[Refusal] = []
    pending = [(1, total)]
    while pending:
        first, last = pending.pop()
        refusal = _probe(conn, publish, slice_view, first, last)
        if refusal is None:
            continue
        if first == last:
            refused.append(replace(refusal, unit=first))
            continue
        middle = (first + last) // 2
        pending += [(middle + 1, last), (first, middle)]  # the first half next: rows keep their order
    if not refused:
        raise LedgerbatchError(f"batch {batch.batch_id}: the target refused the batch as a whole but took each of its "
                               f"rows: nothing to quarantine, the batch fails")
    return refused


def _reason(exc: DBAPIError) -> Refusal:
    orig = exc.orig
    diag = getattr(orig, "diag", None)
    message = (getattr(diag, "message_primary", None) or str(orig).splitlines()[0]).strip()
    return Refusal(0, orig.pgcode, getattr(diag, "constraint_name", None), message, getattr(diag, "column_name", None),
                   getattr(diag, "message_detail", None))

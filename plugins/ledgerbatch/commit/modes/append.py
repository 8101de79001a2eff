"""`mode: append`: every good record is a row, unique on its source coordinates.

Append targets are range-partitioned by batch id (partitions.py): a big batch's staging table is
attached as a partition (metadata only), a small one is copied. A target the user gave triggers has its
rows copied even into a new partition, since ATTACH fires no trigger; so has a batch whose refused rows
were quarantined (commit/rejects.py) where the target has an index of the user's: the removed rows'
versions stay in the staging table until the commit, and the ATTACH's build of that index would take them
too. A replay first deletes what earlier deliveries of its ranges left in the target.
"""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ledgerbatch.commit.modes import partitions
from ledgerbatch.commit.modes.base import TargetMode, target_names
from ledgerbatch.commit.modes.partitions import Partition, plan_publish
from ledgerbatch.commit.target import target_defs
from ledgerbatch.errors import SpecError
from ledgerbatch.ledger.batches import newest_committed_batch
from ledgerbatch.model.batch import Batch, BatchKind
from ledgerbatch.model.ranges import range_arrays
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.sqlfiles import Fragment, query


def partition_name(table: str, batch_id: int) -> str:
    suffix = f"_b{batch_id}"
    return table.encode()[:63 - len(suffix)].decode(errors="ignore") + suffix


def partitions_of(conn: Connection, spec: PipelineSpec) -> list[Partition]:
    """The target's partitions with their batch-id bounds and sizes (rollup.py merges by size)."""
    return [Partition(r.name, r.lower, r.upper, r.size)
            for r in conn.execute(text(query("target_partitions")), target_names(spec))]


class Append(TargetMode):
    rows_match_records = True

    def create_target(self, conn: Connection, spec: PipelineSpec, shape: BatchShape) -> None:
        conn.execute(text(query("create_target_append", defs=target_defs(shape), **target_names(spec))))

    def publish(self, conn: Connection, spec: PipelineSpec, shape: BatchShape, batch: Batch,
                rows: str | None = None) -> int:
        target, columns = target_names(spec), list(shape.names)
        staging, batch_id = batch.staging_table, batch.batch_id
        removed = 0
        if batch.kind != BatchKind.LIVE:
            removed = conn.execute(text(query("delete_target_in_ranges", **target)),
                                   {"batch_id": batch_id, **range_arrays(batch.ranges)}).rowcount
        layout = conn.execute(text(query("target_layout")), target).one()
        plan = None  # a target created before targets were partitioned only takes copies
        if layout.partitioned:
            existing = partitions_of(conn, spec)
            plan = plan_publish(batch_id, batch.rows_written, existing, spec.attach_min_rows or partitions.ATTACH_MIN_ROWS,
                                newest_committed_batch(conn, spec.name))
        if plan is None or not plan.attach:
            conn.execute(text(query("insert_append", staging=rows or staging, columns=columns, **target)))
            return removed
        if not layout.can_attach:
            raise SpecError(f"target {spec.target_schema}.{spec.target_table}: this login may not add partitions to "
                            f"it: it must own the table (or be a member of its owner role) and may CREATE in its schema")
        if plan.close:
            conn.execute(text(query("close_partition", partition=plan.close.name, **target)),
                         {"lower": plan.close.lower, "upper": batch_id})
        upper = Fragment("MAXVALUE" if plan.upper is None else str(int(plan.upper)))
        partition = partition_name(spec.target_table, batch_id)
        copy = (rows is not None or layout.has_triggers
                or conn.execute(text(query("staging_pruned")), {"staging": staging, **target}).scalar_one())
        if copy:  # copied into an empty partition in the staging table's place
            conn.execute(text(query("create_partition", partition=partition, upper=upper, **target)),
                         {"batch_id": batch_id})
            conn.execute(text(query("insert_append", staging=rows or staging, columns=columns, **target)))
            return removed
        _align_staging(conn, target, staging)
        conn.execute(text(query("attach_partition", staging=staging, partition=partition, upper=upper, **target)),
                     {"batch_id": batch_id})
        return removed


def _align_staging(conn: Connection, target: dict, staging: str) -> None:
    """A partition must match its table, and its rows must be what an INSERT would have written. A column
    the target has and staging lacks (one the user added, or a field the schema dropped) is added to the
    staging table filled as an INSERT fills it: its DEFAULT (an identity's next value, `now()`, a constant),
    its generation expression, else NULL. A column the user narrowed (`varchar(n)`) or made NOT NULL, and the
    user's CHECK constraints, are given to it too, each validated over the staged rows: a CHECK the user
    added NOT VALID still judges every row an INSERT writes, so it judges the staged ones (ATTACH would not:
    the parent's constraint being NOT VALID, it skips the scan). Any of these the staged rows break raises
    the server's row error, which commit/rejects.py turns into refused rows as it does the copy path's."""
    columns = text(query("table_columns"))
    at = {"schema": "ledger_staging", "table": staging}
    staged = {r.column_name: r for r in conn.execute(columns, at)}
    for r in conn.execute(columns, target).all():
        have = staged.get(r.column_name)
        if have is None:
            added = "add_generated_column" if r.generated else "add_filled_column" if r.fill else "add_column"
            conn.execute(text(query(added, column=r.column_name, type=Fragment(r.type), fill=Fragment(r.fill or ""),
                                    **at)))
        elif have.type != r.type:
            conn.execute(text(query("set_column_type", column=r.column_name, type=Fragment(r.type), **at)))
        if r.not_null and not (have and have.not_null):
            conn.execute(text(query("set_not_null", column=r.column_name, **at)))
    for check in conn.execute(text(query("table_checks")), target).all():
        validated = check.definition.removesuffix(" NOT VALID")
        conn.execute(text(query("add_check", constraint=check.name, definition=Fragment(validated), **at)))

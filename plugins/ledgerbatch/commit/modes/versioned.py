"""`mode: upsert` with `target.version`: a key's newest change wins by its version (ties: the higher
coordinate), whatever partition, batch or order it arrives in; live, backfilled and replayed alike.

Within a batch the key's highest version is its candidate. It applies where it is at least as new as the
key's last change delivered: its row, or in a change pipeline its delete, which ledger_deletes keeps with
its version. So an older change never applies: a replay of an old range cannot roll a row back, an upsert
older than a delete cannot bring the row back, and a delete older than the row cannot remove it. The same
record delivered again is as new, and applies (a replay may correct its value). The changes that do not
apply are counted as `records_superseded` (sql/queries/mode_versioned.sql).
"""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ledgerbatch.commit.modes.base import prefixed
from ledgerbatch.commit.modes.upsert import APPLY_CHANGES, Upsert, set_list
from ledgerbatch.identifiers import quote_ident
from ledgerbatch.ledger.batches import record_set_aside
from ledgerbatch.model.batch import Batch, BatchKind
from ledgerbatch.model.ranges import range_arrays
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.sqlfiles import Fragment, query

class VersionedUpsert(Upsert):
    def publish(self, conn: Connection, spec: PipelineSpec, shape: BatchShape, batch: Batch,
                rows: str | None = None) -> None:
        names = self._names(spec, shape, batch)
        if batch.kind != BatchKind.LIVE:  # rows of the ranges whose records no longer give them go first
            conn.execute(text(query("replay_drop_stale_changes" if shape.changes else "replay_drop_stale", **names)),
                         range_arrays(batch.ranges))
        conn.execute(text(query("newest_changes" if shape.changes else "newest_rows",
                                **(names | {"staging": rows or batch.staging_table}))))
        for step in APPLY_CHANGES if shape.changes else ("apply_upserts",):
            conn.execute(text(query(step, **names)))
        if rows is None:  # the batch's publish, not a probe of some of its rows (commit/rejects.py)
            by_range = conn.execute(text(query("superseded_by_range", **names))).all()
            if by_range:
                record_set_aside(conn, batch.batch_id, "superseded", {(r.topic, r.partition): r.rows for r in by_range},
                                 sum(r.deletes for r in by_range))
        conn.execute(text(query("drop_last_changes")))

    def unit_order(self, spec: PipelineSpec) -> str:
        """A key's rows next to each other, oldest first."""
        return ", ".join([quote_ident(k) for k in spec.key] + [quote_ident(spec.version_by), "_offset",
                                                                  "_partition", "_topic"])

    def diff(self, conn: Connection, spec: PipelineSpec, shape: BatchShape, batch: Batch):
        names = self._names(spec, shape, batch)
        columns = shape.names
        conn.execute(text(query("newest_changes" if shape.changes else "newest_rows", **names)))
        diff = conn.execute(text(query("versioned_diff", columns_c=prefixed("c", columns),
                                       columns_t=prefixed("t", columns), **names)), range_arrays(batch.ranges)).one()
        conn.execute(text(query("drop_last_changes")))
        return diff

    def _names(self, spec: PipelineSpec, shape: BatchShape, batch: Batch) -> dict:
        version = quote_ident(shape.version)
        changes = shape.changes
        return self._change_names(spec, shape, batch, set_list(shape)) | dict(
            version=shape.version,
            newest=Fragment(f"{version} DESC NULLS LAST, _offset DESC, _partition DESC, _topic DESC"),
            is_change=Fragment("s._change <> 's'" if changes else "true"),
            is_change_c=Fragment("c._change <> 's'" if changes else "true"),
            is_delete=Fragment("s._change = 'd'" if changes else "false"))

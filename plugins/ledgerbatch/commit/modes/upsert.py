"""`mode: upsert`: one row per key; within a batch the highest offset wins, across batches the later
batch (with `target.version` the newest version wins instead: versioned.py). A replay replaces only rows
whose value came from its ranges: newer values are kept; a row from its ranges of a key it gives no row any
more (the record is now bad or filtered) is removed.

Change pipelines (`format: debezium`, `target.deletes: true`) stage changes: a key's last change in the
batch upserts or deletes its row. The last delete of each deleted key is kept in
`ledger_deletes.<pipeline>` (with its coordinates, like a row's), so a replay decides by the key's
last change delivered, row or delete, whether its own change is newer (sql/queries/mode_upsert.sql)."""
from __future__ import annotations

import logging

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ledgerbatch.commit.modes.base import TargetMode, prefixed, target_names
from ledgerbatch.commit.target import evolve_target, table_exists, target_defs
from ledgerbatch.identifiers import quote_ident
from ledgerbatch.ledger.compaction import backfill_gaps
from ledgerbatch.ledger.inspection import deleted_key_violations
from ledgerbatch.model.batch import Batch, BatchKind
from ledgerbatch.model.ranges import range_arrays
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.sqlfiles import Fragment, query


log = logging.getLogger(__name__)

# What a change pipeline's winning changes (lb_last_changes) do, in order (sql/queries/mode_upsert.sql).
APPLY_CHANGES = ("apply_deletes", "apply_upserts", "forget_deletes", "record_deletes")


class Upsert(TargetMode):
    rows_match_records = False  # several records of one key make one row

    def create_target(self, conn: Connection, spec: PipelineSpec, shape: BatchShape) -> None:
        conn.execute(text(query("create_target_upsert", defs=target_defs(shape), key=list(shape.key),
                                **target_names(spec))))
        if shape.changes:
            conn.execute(text(query("create_deletes", defs=target_defs(shape), key=list(shape.key),
                                    deletes=deletes_table(spec))))

    def ensure_target(self, conn: Connection, spec: PipelineSpec, shape: BatchShape) -> None:
        super().ensure_target(conn, spec, shape)
        if shape.changes:
            evolve_target(conn, spec, shape, at=("ledger_deletes", deletes_table(spec)))

    def publish(self, conn: Connection, spec: PipelineSpec, shape: BatchShape, batch: Batch,
                rows: str | None = None) -> None:
        if shape.changes:
            return self._publish_changes(conn, spec, shape, batch, rows)
        if batch.kind != BatchKind.LIVE:
            conn.execute(text(query("replay_drop_stale", staging=batch.staging_table, match_t=match_key("t", shape.key),
                                    **target_names(spec))), range_arrays(batch.ranges))
        sql = query("insert_upsert" if batch.kind == BatchKind.LIVE else "replay_upsert", key=list(shape.key),
                    set_list=set_list(shape), staging=rows or batch.staging_table, columns=list(shape.names),
                    **target_names(spec))
        conn.execute(text(sql), range_arrays(batch.ranges))

    def diff(self, conn: Connection, spec: PipelineSpec, shape: BatchShape, batch: Batch):
        """A dry run by key, as the replay would decide: a change pipeline's winning changes add or change
        rows (or leave them unchanged), its deletes remove them; a plain pipeline's last row per key does,
        and rows of the ranges whose key it no longer gives are removed."""
        columns = shape.names
        if not shape.changes:
            return conn.execute(text(query("upsert_replay_diff", key=list(shape.key), staging=batch.staging_table,
                                           columns_c=prefixed("c", columns), columns_t=prefixed("t", columns),
                                           match_t=match_key("t", shape.key), **target_names(spec))),
                                range_arrays(batch.ranges)).one()
        names = self._change_names(spec, shape, batch, Fragment(""))
        conn.execute(text(query("last_changes", **names)), {"live": False, **range_arrays(batch.ranges)})
        diff = conn.execute(text(query("changes_diff", columns_c=prefixed("c", columns),
                                       columns_t=prefixed("t", columns), **names))).one()
        conn.execute(text(query("drop_last_changes")))
        return diff

    def fold_history(self, conn: Connection, spec: PipelineSpec, through: int) -> tuple[int, bool]:
        """A change pipeline forgets the deletes of folded batches: a replay of their offsets could then
        bring a deleted key back, so it is refused from here on (the replay horizon). Not while a backfill
        can still deliver offsets below the start (ledger/compaction.py: backfill_gaps): its change of a
        deleted key must lose to the delete, so the deletes are kept until no backfill can come."""
        if not spec.changes or not table_exists(conn, "ledger_deletes", deletes_table(spec)):
            return 0, spec.changes
        gaps = backfill_gaps(conn, spec.name)
        if gaps:
            log.info("%s: deletes kept: a backfill can still deliver %s%s", spec.name,
                     ", ".join(map(str, gaps[:3])), f" and {len(gaps) - 3} more ranges" if len(gaps) > 3 else "")
            return 0, True
        forgotten = conn.execute(text(query("fold_deletes", deletes=deletes_table(spec))), {"through": through})
        return forgotten.rowcount, True

    def violations(self, conn: Connection, spec: PipelineSpec) -> list[str]:
        problems = super().violations(conn, spec)
        if spec.changes and table_exists(conn, "ledger_deletes", deletes_table(spec)):
            problems += deleted_key_violations(conn, spec.name, target_names(spec), deletes_table(spec),
                                                      list(spec.key))
        return problems

    @staticmethod
    def _publish_changes(conn: Connection, spec: PipelineSpec, shape: BatchShape, batch: Batch,
                         rows: str | None) -> None:
        """Each key's last change that wins (last_changes) deletes or upserts its row, and moves the key
        out of or into the pipeline's deletes."""
        names = Upsert._change_names(spec, shape, batch, set_list(shape))
        if batch.kind != BatchKind.LIVE:
            conn.execute(text(query("replay_drop_stale_changes", **names)), range_arrays(batch.ranges))
        conn.execute(text(query("last_changes", **(names | {"staging": rows or batch.staging_table}))),
                     {"live": batch.kind == BatchKind.LIVE, **range_arrays(batch.ranges)})
        for step in (*APPLY_CHANGES, "drop_last_changes"):
            conn.execute(text(query(step, **names)))

    @staticmethod
    def _change_names(spec: PipelineSpec, shape: BatchShape, batch: Batch, set_list: Fragment) -> dict:
        kept = list(shape.key) + ([shape.version] if shape.version else [])  # what a delete keeps
        return dict(key=list(shape.key), columns=list(shape.names), staging=batch.staging_table,
                    deletes=deletes_table(spec), match_t=match_key("t", shape.key), match_d=match_key("d", shape.key),
                    set_list=set_list, kept=kept, kept_excluded=prefixed("EXCLUDED", kept), **target_names(spec))


def set_list(shape: BatchShape) -> Fragment:
    """An upsert's `SET col = EXCLUDED.col, ...`: the shape's columns and the lineage."""
    updated = list(shape.names) + [c.name for c in shape.lineage]
    return Fragment(", ".join(f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in updated))


def deletes_table(spec: PipelineSpec) -> str:
    """The pipeline's deleted keys: ledger_deletes.<pipeline>."""
    return spec.name


def match_key(alias: str, key) -> Fragment:
    """The key of `alias` equals the key of the last change `c`."""
    return Fragment(" AND ".join(f"{alias}.{quote_ident(k)} = c.{quote_ident(k)}" for k in key))



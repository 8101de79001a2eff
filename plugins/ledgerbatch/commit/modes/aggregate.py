"""`mode: aggregate`: one row per key; each batch's groups merge into it exactly once.

Every committed batch's groups are also kept as its contribution (`ledger_aggregates.<pipeline>`).
A live batch adds to the target directly (sum adds, min and max keep the extreme), so a commit
costs the same whatever the history. A replay or backfill takes the contributions of the batches
it supersedes out, puts its own in and recomputes the groups either touches from the
contributions, so sums and min and max are exact after any replay. Replays are whole batches: the
replay planner widens a requested range to the batches that delivered it (plan/replay.py).
"""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ledgerbatch.commit.modes.base import TargetMode, prefixed, target_names
from ledgerbatch.commit.target import evolve_target, table_exists
from ledgerbatch.errors import FencedError
from ledgerbatch.identifiers import quote_ident
from ledgerbatch.ledger.batches import delivering_batches
from ledgerbatch.ledger.inspection import aggregate_violations
from ledgerbatch.model.batch import Batch, BatchKind
from ledgerbatch.model.ranges import covers
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.sqlfiles import Fragment, query

_MERGE = {"sum": "COALESCE(t.{c} + EXCLUDED.{c}, t.{c}, EXCLUDED.{c})",
          "min": "LEAST(t.{c}, EXCLUDED.{c})", "max": "GREATEST(t.{c}, EXCLUDED.{c})"}


def contributions_table(spec: PipelineSpec) -> str:
    return spec.name


class Aggregate(TargetMode):
    rows_match_records = False  # many records make one group
    rows_are_records = False  # a group the target refuses stands for records nobody can name: it fails the batch

    def create_target(self, conn: Connection, spec: PipelineSpec, shape: BatchShape) -> None:
        conn.execute(text(query("create_target_aggregate", defs=Fragment(shape.column_defs), key=list(shape.key),
                                **target_names(spec))))
        conn.execute(text(query("create_contributions", defs=Fragment(shape.column_defs), key=list(shape.key),
                                key_index=f"{spec.name[:50]}_by_key", contributions=contributions_table(spec))))

    def ensure_target(self, conn: Connection, spec: PipelineSpec, shape: BatchShape) -> None:
        super().ensure_target(conn, spec, shape)  # groups: the batch id is their lineage (shape.lineage)
        evolve_target(conn, spec, shape, at=("ledger_aggregates", contributions_table(spec)))

    def publish(self, conn: Connection, spec: PipelineSpec, shape: BatchShape, batch: Batch,
                rows: str | None = None) -> None:
        names = self._names(spec, shape, batch)
        conn.execute(text(query("insert_contributions", **names)))  # before a replay's recompute reads them
        if batch.kind == BatchKind.LIVE:
            merge = Fragment(", ".join(f"{quote_ident(m)} = " + _MERGE[how].format(c=quote_ident(m))
                                       for m, how in spec.measures))
            conn.execute(text(query("merge_groups", merge_list=merge, **names)))
            return
        superseded = {"superseded": self.superseded(conn, spec, batch)}
        # The groups the superseded contributions touched, noted before they go, and the new one's.
        conn.execute(text(query("note_affected_groups", **names)), superseded)
        conn.execute(text(query("delete_contributions", **names)), superseded)
        # The new contribution is in, the superseded ones are out: recompute what either touched.
        conn.execute(text(query("recompute_groups", key_t=prefixed("t", shape.key), key_a=prefixed("a", shape.key),
                                measures_agg=measures_merged(spec), **names)))

    def diff(self, conn: Connection, spec: PipelineSpec, shape: BatchShape, batch: Batch):
        superseded = {"superseded": self.superseded(conn, spec, batch)}
        return conn.execute(text(query("aggregate_diff", measures_agg=measures_merged(spec), differs=measures_differ(spec),
                                       **self._names(spec, shape, batch))), superseded).one()

    def fold_history(self, conn: Connection, spec: PipelineSpec, through: int) -> tuple[int, bool]:
        """The folded batches' contributions merge into one per group: a replay can no longer take one batch's
        out, so replays of their offsets are refused from here on (the replay horizon)."""
        if table_exists(conn, "ledger_aggregates", contributions_table(spec)):
            columns = [*spec.key, *(m for m, _ in spec.measures)]  # a query's output: its key and measures
            conn.execute(text(query("fold_contributions", key=list(spec.key), columns=columns,
                                    measures_agg=measures_merged(spec), contributions=contributions_table(spec))),
                         {"through": through})
        return 0, True

    def violations(self, conn: Connection, spec: PipelineSpec) -> list[str]:
        return aggregate_violations(conn, spec.name, target_names(spec), contributions_table(spec),
                                           list(spec.key), measures_merged(spec), measures_differ(spec))

    @staticmethod
    def superseded(conn: Connection, spec: PipelineSpec, batch: Batch) -> list[int]:
        """The committed batches whose offsets this replay delivers again: each must lie wholly inside
        its ranges (the planner widened them so), or the replay cannot take its contribution out."""
        delivering = delivering_batches(conn, spec.name, batch.ranges, batch.batch_id)
        for other, ranges in delivering.items():
            if not covers(batch.ranges, ranges):
                raise FencedError(f"batch {batch.batch_id}: committed batch {other} delivered part of its ranges and "
                                  f"more; an aggregate replay covers whole batches: plan it again")
        return sorted(delivering)

    @staticmethod
    def _names(spec: PipelineSpec, shape: BatchShape, batch: Batch) -> dict:
        measures = [m for m, _ in spec.measures]
        return dict(key=list(shape.key), measures=measures, columns=list(shape.names),
                    staging=batch.staging_table, contributions=contributions_table(spec), **target_names(spec))


def measures_merged(spec: PipelineSpec) -> Fragment:
    """Each measure merged over contributions `c`, named as the measure."""
    return Fragment(", ".join(f"{how}(c.{quote_ident(m)}) AS {quote_ident(m)}" for m, how in spec.measures))


def measures_differ(spec: PipelineSpec) -> Fragment:
    """Whether a group `c` of the target differs from `r`, its contributions merged."""
    return Fragment(" OR ".join(f"c.{quote_ident(m)} IS DISTINCT FROM r.{quote_ident(m)}" for m, _ in spec.measures))

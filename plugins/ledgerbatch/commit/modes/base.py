"""The one interface every target mode implements."""
from __future__ import annotations

from abc import ABC, abstractmethod

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ledgerbatch.commit.target import evolve_target
from ledgerbatch.identifiers import quote_ident
from ledgerbatch.ledger.inspection import target_violations
from ledgerbatch.model.batch import Batch
from ledgerbatch.model.ranges import range_arrays
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.sqlfiles import Fragment, query


class TargetMode(ABC):
    #: every record read is a target row or quarantined, so `verify` can count them
    rows_match_records: bool
    #: every staged row stands for one record, so a row the target refuses can be quarantined as that record
    rows_are_records: bool = True

    def ensure_target(self, conn: Connection, spec: PipelineSpec, shape: BatchShape) -> None:
        """Create the target on first use, evolve it to the batch's shape as the spec allows, refuse it if it
        disagrees."""
        self.create_target(conn, spec, shape)
        evolve_target(conn, spec, shape)

    @abstractmethod
    def create_target(self, conn: Connection, spec: PipelineSpec, shape: BatchShape) -> None:
        """CREATE TABLE IF NOT EXISTS in this mode's layout, with the shape's columns."""

    @abstractmethod
    def publish(self, conn: Connection, spec: PipelineSpec, shape: BatchShape, batch: Batch,
                rows: str | None = None) -> int | None:
        """Move the batch's staged good rows (ledger_staging.<batch.staging_table>, in `shape`) into the target.
        Where rows match records (`rows_match_records`), a replay returns how many rows of earlier deliveries of
        its ranges it removed, for `verify`'s count. `rows` names a relation in ledger_staging holding part
        of the staged rows to publish instead (commit/rejects.py probes runs of rows); what a replay removes
        is still decided by the whole batch."""

    def fold_history(self, conn: Connection, spec: PipelineSpec, through: int) -> tuple[int, bool]:
        """Ledger compaction (ledger/compaction.py) folds the pipeline's batches up to `through`: fold what this
        mode keeps per batch beside the target. Returns (deletes forgotten, whether replays of the folded
        offsets must now be refused: the replay horizon)."""
        return 0, False

    def unit_order(self, spec: PipelineSpec) -> str:
        """The order in which rows are judged (commit/rejects.py): by coordinates, so that of two records a
        rule sets against each other (a unique index across two keys) the later one is refused, as if they
        had arrived one at a time. Upsert too: a key whose older record is kept and newer one refused holds
        the older, as it would have."""
        return "_topic, _partition, _offset"

    def diff(self, conn: Connection, spec: PipelineSpec, shape: BatchShape, batch: Batch):
        """A staged replay against the target, as (added, removed, changed, unchanged) rows."""
        return conn.execute(text(query("replay_diff", staging=batch.staging_table, columns=list(shape.names),
                                       **target_names(spec))), range_arrays(batch.ranges)).one()

    def violations(self, conn: Connection, spec: PipelineSpec) -> list[str]:
        """`verify`: target rows the ledger cannot account for."""
        return target_violations(conn, spec.name, spec.target_schema, spec.target_table, self.rows_match_records)


def target_names(spec: PipelineSpec) -> dict[str, str]:
    return dict(schema=spec.target_schema, table=spec.target_table)


def prefixed(alias: str, columns) -> Fragment:
    """`alias."a", alias."b"`: validated column names qualified by a table alias."""
    return Fragment(", ".join(f"{alias}.{quote_ident(c)}" for c in columns))

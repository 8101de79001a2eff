"""A batch's staging tables (sql/queries/staging.sql): their names, their DDL from the batch's shape
(model/shape.py), creating them in one call (`open_staging`), and `StagingTables`: what stage and commit ask
of them (counts, overlap, bad records, drop)."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from ledgerbatch.ledger.batches import finished_staging_tables, staged_read_statement
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.model.statements import StagingStatements
from ledgerbatch.sqlfiles import Fragment, query
from ledgerbatch.stage.job import StagingTable

log = logging.getLogger(__name__)


def staging_name(batch_id: int, attempt: int) -> str:
    return f"b{batch_id}_a{attempt}"


def staging_defs(shape: BatchShape) -> Fragment:
    defs = Fragment(shape.column_defs)
    if shape.changes:  # a delete row holds only the key, a skipped record (a tombstone) nothing but lineage
        return Fragment(f"{defs},\n    \"_change\" text NOT NULL CHECK (\"_change\" IN ('u', 'd', 's'))")
    return defs


def staging_statements(shape: BatchShape, staging: str, binary: bool) -> StagingStatements:
    """What an attempt's staging tasks run, rendered here because executors may not have sql/. `binary`:
    its good rows' (or query output's) COPY is binary (shape.binary_types)."""
    tables = StagingTables(staging)
    copy = query("staging_copy_binary" if binary else "staging_copy", staging=staging,
                 columns=list(shape.staged_names))
    if shape.output_schema is None:
        return StagingStatements(session=query("staging_session"), lock=query("staging_task_lock"), copy=copy,
                                 delete=query("staging_delete_partition", staging=staging, bad=tables.bad),
                                 copy_bad=query("staging_copy_bad", bad=tables.bad))
    return StagingStatements(
        session=query("staging_session"), lock=query("staging_task_lock"), copy=copy, delete="",
        copy_bad=query("staging_copy_bad", bad=tables.bad),
        delete_bad=query("staging_delete_bad", bad=tables.bad),
        record_read=staged_read_statement(),
        # aggregate staging holds groups, without coordinates
        copy_output=(query("staging_copy_groups_binary" if binary else "staging_copy_groups", staging=staging,
                           columns=list(shape.names)) if shape.groups else copy),
    )


def open_staging(conn: Connection, shape: BatchShape, batch_id: int, attempt: int, dsn: str) -> StagingTable:
    """Create an attempt's staging tables and say how its tasks reach them (`dsn`: libpq, for executors)."""
    tables = StagingTables(staging_name(batch_id, attempt))
    tables.create(conn, shape, batch_id)
    types = shape.binary_types
    return StagingTable(dsn, tables.name, staging_statements(shape, tables.name, bool(types)), shape.staged_names,
                        batch_id, types)


@dataclass(frozen=True)
class StagingTables:
    """An attempt's staging tables, its good rows (`name`) and its bad records (`bad`), as the driver that
    stages into them and the commit that reconciles and publishes them ask of them."""
    name: str

    @property
    def bad(self) -> str:
        return f"{self.name}_bad"

    def create(self, conn: Connection, shape: BatchShape, batch_id: int) -> None:
        """The table of good rows (an aggregate's: of groups, one per key) and of bad records, granted to the
        executors' role."""
        if shape.groups:
            conn.execute(text(query("create_staging_groups", staging=self.name, defs=Fragment(shape.column_defs),
                                    key=list(shape.key))), {"batch_id": batch_id})
        else:
            conn.execute(text(query("create_staging", staging=self.name, defs=staging_defs(shape))),
                         {"batch_id": batch_id})
        conn.execute(text(query("create_staging_bad", bad=self.bad)))
        conn.execute(text(query("grant_staging", staging=self.name, bad=self.bad)))
        if not shape.groups:
            conn.execute(text(query("grant_staging_coordinates", staging=self.name)))

    def complete(self, conn: Connection, shape: BatchShape) -> bool:
        """Both tables exist, the good rows carry their batch id (an earlier version staged into one table
        without it) and every column of the shape (the spec may have changed since staging)."""
        return conn.execute(text(query("staging_complete")), {"staging": self.name, "bad": self.bad,
                                                              "columns": [*shape.staged_names, "_batch_id"]}).scalar_one()

    def lock(self, conn: Connection) -> None:
        conn.execute(text(query("lock_staging", staging=self.name, bad=self.bad)))

    def columns(self, conn: Connection) -> list[str]:
        """The good rows' table's columns as they are, in order."""
        return [r.column_name for r in conn.execute(text(query("table_columns")),
                                                    {"schema": "ledger_staging", "table": self.name})]

    def counts(self, conn: Connection) -> list:
        """Rows and bad records per partition, counted by parallel workers (the commit waits for the count)."""
        conn.execute(text(query("cheap_parallel_scans")))
        counts = conn.execute(text(query("staged_counts", staging=self.name, bad=self.bad))).all()
        conn.execute(text(query("default_parallel_scans")))
        return counts

    def changes(self, conn: Connection) -> tuple[int, int]:
        """A change pipeline's staged (deletes, skipped records)."""
        row = conn.execute(text(query("staged_changes", staging=self.name))).one()
        return row.deleted, row.skipped

    def overlap(self, conn: Connection) -> int:
        """Offsets staged both as rows and as bad records (none, unless something is wrong)."""
        return conn.execute(text(query("staged_overlap", staging=self.name, bad=self.bad))).scalar_one()

    def rows(self, conn: Connection) -> int:
        return conn.execute(text(query("staged_rows", staging=self.name))).scalar_one()

    def bad_counts(self, conn: Connection) -> dict[tuple[str, int], int]:
        """Bad records per partition."""
        return {(r.topic, r.partition): r.bad for r in conn.execute(text(query("staged_bad", bad=self.bad)))}

    def drop(self, conn: Connection) -> None:
        conn.execute(text(query("drop_staging", staging=self.name, bad=self.bad)))


def drop_finished_staging(engine: Engine, pipeline: str) -> list[str]:
    """Best effort: staging tables of the pipeline's finished batches (a crash can leave them)."""
    with engine.connect() as conn:
        names = finished_staging_tables(conn, pipeline)
    return drop_staging_quietly(engine, names)


def drop_staging_quietly(engine: Engine, names: list[str], lock_timeout_ms: int = 2000) -> list[str]:
    """Drop each table in its own short transaction; one still locked by a stalled attempt is left
    for a later call. Returns the tables that remain."""
    remaining = []
    for name in names:
        try:
            with engine.begin() as conn:
                conn.execute(text(query("set_lock_timeout")), {"ms": f"{lock_timeout_ms}ms"})
                StagingTables(name).drop(conn)
        except OperationalError:
            remaining.append(name)
    return remaining

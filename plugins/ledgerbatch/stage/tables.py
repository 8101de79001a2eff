"""A batch's staging tables (sql/queries/staging.sql): their names and shapes, creating them in one call
(`open_staging`), what they hold, and dropping them. The target's shape is commit/target.py."""
from __future__ import annotations

import logging

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from ledgerbatch.formats.schema import BATCH_ID, COORDINATE_NAMES, LINEAGE
from ledgerbatch.identifiers import quote_ident
from ledgerbatch.ledger.batches import finished_staging_tables, staged_read_statement
from ledgerbatch.model.statements import StagingStatements
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.sqlfiles import Fragment, query
from ledgerbatch.stage.job import StagingTable

log = logging.getLogger(__name__)


def staging_name(batch_id: int, attempt: int) -> str:
    return f"b{batch_id}_a{attempt}"


def bad_name(staging: str) -> str:
    """The attempt's table of bad records, beside its table of good rows."""
    return f"{staging}_bad"


def column_defs(spec: PipelineSpec) -> Fragment:
    return Fragment(",\n    ".join(f"{quote_ident(c.name)} {c.pg_type}" for c in spec.stored_columns))


def column_names(spec: PipelineSpec) -> list[str]:
    """The target's columns before lineage, in order."""
    return [c.name for c in spec.stored_columns]


def staging_columns(conn: Connection, staging: str) -> list[str]:
    """A staging table's columns as they are, in order."""
    return [r.column_name for r in conn.execute(text(query("table_columns")),
                                                {"schema": "ledger_staging", "table": staging})]


def staged_column_names(spec: PipelineSpec) -> list[str]:
    """The staged good rows' columns before lineage: the target's, and what a change does (parse.CHANGE)."""
    return column_names(spec) + (["_change"] if spec.changes else [])


def binary_types(spec: PipelineSpec) -> tuple[str, ...]:
    """The types of the good rows' COPY columns (a query pipeline's: its output's, as staging_statements'
    copy_output takes them) where every one has a binary encoder, else ()."""
    from ledgerbatch.stage import binary_copy

    lineage = (BATCH_ID,) if spec.mode == "aggregate" else LINEAGE  # aggregate staging holds groups
    types = tuple(c.pg_type for c in spec.stored_columns) + (("text",) if spec.changes else ())
    types += tuple(c.pg_type for c in lineage)
    return types if binary_copy.encodable(types) else ()


def staging_defs(spec: PipelineSpec) -> Fragment:
    defs = column_defs(spec)
    if spec.changes:  # a delete row holds only the key, a skipped record (a tombstone) nothing but lineage
        return Fragment(f"{defs},\n    \"_change\" text NOT NULL CHECK (\"_change\" IN ('u', 'd', 's'))")
    return defs


def staging_statements(spec: PipelineSpec, staging: str, binary: bool) -> StagingStatements:
    """What an attempt's staging tasks run, rendered here because executors may not have sql/. `spec`
    is the target's view of it (a query pipeline's: transform.output_spec); `binary`: its good rows'
    (or query output's) COPY is binary (binary_types)."""
    copy = query("staging_copy_binary" if binary else "staging_copy", staging=staging,
                 columns=staged_column_names(spec))
    if spec.query is None:
        return StagingStatements(session=query("staging_session"), lock=query("staging_task_lock"), copy=copy,
                                 delete=query("staging_delete_partition", staging=staging, bad=bad_name(staging)),
                                 copy_bad=query("staging_copy_bad", bad=bad_name(staging)))
    return StagingStatements(
        session=query("staging_session"), lock=query("staging_task_lock"), copy=copy, delete="",
        copy_bad=query("staging_copy_bad", bad=bad_name(staging)),
        delete_bad=query("staging_delete_bad", bad=bad_name(staging)),
        record_read=staged_read_statement(),
        # aggregate staging holds groups, without coordinates
        copy_output=(query("staging_copy_groups_binary" if binary else "staging_copy_groups", staging=staging,
                           columns=column_names(spec)) if spec.mode == "aggregate" else copy),
    )


def output_order(spec: PipelineSpec) -> tuple[str, ...]:
    """A query's output columns in the order staging_statements' copy_output takes them."""
    lineage = () if spec.mode == "aggregate" else COORDINATE_NAMES
    return tuple(column_names(spec)) + lineage


def open_staging(conn: Connection, spec: PipelineSpec, batch_id: int, attempt: int, dsn: str) -> StagingTable:
    """Create an attempt's staging tables and say how its tasks reach them (`dsn`: libpq, for executors).
    `spec` is the target's view of the pipeline (a query pipeline's: transform.output_spec)."""
    name = staging_name(batch_id, attempt)
    create_staging(conn, spec, name, batch_id)
    types = binary_types(spec)
    return StagingTable(dsn, name, staging_statements(spec, name, bool(types)), tuple(staged_column_names(spec)),
                        batch_id, types)


def create_staging(conn: Connection, spec: PipelineSpec, staging: str, batch_id: int) -> None:
    """The attempt's table of good rows (an aggregate's: of groups, one per key) and of bad records."""
    if spec.mode == "aggregate":
        conn.execute(text(query("create_staging_groups", staging=staging, defs=column_defs(spec), key=list(spec.key))),
                     {"batch_id": batch_id})
    else:
        conn.execute(text(query("create_staging", staging=staging, defs=staging_defs(spec))), {"batch_id": batch_id})
    conn.execute(text(query("create_staging_bad", bad=bad_name(staging))))


def staged_rows(conn: Connection, staging: str) -> int:
    return conn.execute(text(query("staged_rows", staging=staging))).scalar_one()


def staged_bad(conn: Connection, staging: str) -> dict[tuple[str, int], int]:
    return {(r.topic, r.partition): r.bad for r in conn.execute(text(query("staged_bad", bad=bad_name(staging))))}


def staging_complete(conn: Connection, spec: PipelineSpec, staging: str) -> bool:
    """Both staging tables exist, the good rows carry their batch id (an earlier version staged into
    one table without it) and every column the spec has now (it may have changed since staging)."""
    return conn.execute(text(query("staging_complete")), {"staging": staging, "bad": bad_name(staging),
                                                          "columns": staged_column_names(spec) + ["_batch_id"]}).scalar_one()


def lock_staging(conn: Connection, staging: str) -> None:
    conn.execute(text(query("lock_staging", staging=staging, bad=bad_name(staging))))


def staged_counts(conn: Connection, staging: str) -> list:
    """Rows and bad records per partition, counted by parallel workers (the commit waits for the count)."""
    conn.execute(text(query("cheap_parallel_scans")))
    counts = conn.execute(text(query("staged_counts", staging=staging, bad=bad_name(staging)))).all()
    conn.execute(text(query("default_parallel_scans")))
    return counts


def staged_changes(conn: Connection, staging: str) -> tuple[int, int]:
    """A change pipeline's staged (deletes, skipped records)."""
    row = conn.execute(text(query("staged_changes", staging=staging))).one()
    return row.deleted, row.skipped


def staged_overlap(conn: Connection, staging: str) -> int:
    return conn.execute(text(query("staged_overlap", staging=staging, bad=bad_name(staging)))).scalar_one()


def drop_staging(conn: Connection, staging: str) -> None:
    conn.execute(text(query("drop_staging", staging=staging, bad=bad_name(staging))))


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
                drop_staging(conn, name)
        except OperationalError:
            remaining.append(name)
    return remaining

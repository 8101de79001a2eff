"""Shapes of a pipeline's staging and target tables (sql/queries/tables.sql); filling the target is
the target mode's job (modes/)."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from . import ledger
from .errors import SpecError
from .identifiers import quote_ident
from .schema import LINEAGE
from .spec import PipelineSpec
from .sqlfiles import Fragment, query
from .statements import StagingStatements

# information_schema.columns.data_type of each PostgreSQL type ledgerbatch creates
_INFO_TYPES = {"timestamptz": "timestamp with time zone"}


def staging_name(batch_id: int, attempt: int) -> str:
    return f"b{batch_id}_a{attempt}"


def bad_name(staging: str) -> str:
    """The attempt's table of bad records, beside its table of good rows."""
    return f"{staging}_bad"


def column_defs(spec: PipelineSpec) -> Fragment:
    return Fragment(",\n    ".join(f"{quote_ident(c.name)} {c.pg_type}" for c in spec.columns))


def column_names(spec: PipelineSpec) -> list[str]:
    return [c.name for c in spec.columns]


def staging_statements(spec: PipelineSpec, staging: str) -> StagingStatements:
    """What an attempt's staging tasks run, rendered here because executors may not have sql/."""
    return StagingStatements(
        lock=query("staging_task_lock"),
        delete=query("staging_delete_partition", staging=staging, bad=bad_name(staging)),
        copy=query("staging_copy", staging=staging, columns=column_names(spec)),
        copy_bad=query("staging_copy_bad", bad=bad_name(staging)),
    )


def create_staging(conn: Connection, spec: PipelineSpec, staging: str, batch_id: int) -> None:
    conn.execute(text(query("create_staging", staging=staging, bad=bad_name(staging), defs=column_defs(spec))),
                 {"batch_id": batch_id})


def table_exists(conn: Connection, schema: str, table: str) -> bool:
    return conn.execute(text(query("table_exists")), {"schema": schema, "table": table}).scalar_one()


def check_target_shape(conn: Connection, spec: PipelineSpec) -> None:
    """Refuse a target whose columns disagree with the spec."""
    rows = conn.execute(text(query("table_columns")), {"schema": spec.target_schema, "table": spec.target_table})
    actual = {r.column_name: r for r in rows}
    expected = {c.name: c.pg_type for c in spec.columns + LINEAGE}
    problems = []
    for name, pg_type in expected.items():
        col = actual.get(name)
        base = pg_type.split("(")[0]
        if col is None:
            problems.append(f"{name} is missing")
        elif col.data_type != _INFO_TYPES.get(base, base):
            problems.append(f"{name} is {col.data_type}, the spec says {pg_type}")
        elif base == "numeric" and f"numeric({col.numeric_precision},{col.numeric_scale})" != pg_type:
            problems.append(f"{name} is numeric({col.numeric_precision},{col.numeric_scale}), the spec says {pg_type}")
    if problems:
        raise SpecError(f"target table {spec.target_schema}.{spec.target_table} disagrees with the spec: {'; '.join(problems)}")


def staging_complete(conn: Connection, staging: str) -> bool:
    """Both staging tables exist and the good rows carry their batch id (an earlier version staged
    into one table without it)."""
    return conn.execute(text(query("staging_complete")), {"staging": staging, "bad": bad_name(staging)}).scalar_one()


def lock_staging(conn: Connection, staging: str) -> None:
    conn.execute(text(query("lock_staging", staging=staging, bad=bad_name(staging))))


def staged_counts(conn: Connection, staging: str) -> list:
    return conn.execute(text(query("staged_counts", staging=staging, bad=bad_name(staging)))).all()


def staged_overlap(conn: Connection, staging: str) -> int:
    return conn.execute(text(query("staged_overlap", staging=staging, bad=bad_name(staging)))).scalar_one()


def drop_staging(conn: Connection, staging: str) -> None:
    conn.execute(text(query("drop_staging", staging=staging, bad=bad_name(staging))))


def drop_finished_staging(engine: Engine, pipeline: str) -> list[str]:
    """Best effort: staging tables of the pipeline's finished batches (a crash can leave them)."""
    with engine.connect() as conn:
        names = ledger.finished_staging_tables(conn, pipeline)
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

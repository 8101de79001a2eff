"""Shapes of a pipeline's staging and target tables (sql/queries/tables.sql); filling the target is
the target mode's job (modes/)."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

import logging

from . import ledger
from .errors import SpecError
from .evolve import plan_evolution
from .identifiers import quote_ident
from .schema import LINEAGE
from .spec import PipelineSpec
from .sqlfiles import Fragment, query
from .statements import StagingStatements

log = logging.getLogger(__name__)

def staging_name(batch_id: int, attempt: int) -> str:
    return f"b{batch_id}_a{attempt}"


def bad_name(staging: str) -> str:
    """The attempt's table of bad records, beside its table of good rows."""
    return f"{staging}_bad"


def column_defs(spec: PipelineSpec) -> Fragment:
    return Fragment(",\n    ".join(f"{quote_ident(c.name)} {c.pg_type}" for c in spec.stored_columns))


def target_defs(spec: PipelineSpec) -> Fragment:
    """A target's columns: the spec's, then the lineage, which is never NULL."""
    lineage = [f"{quote_ident(c.name)} {c.pg_type} NOT NULL" for c in LINEAGE]
    return Fragment(",\n    ".join([column_defs(spec)] + lineage))


def column_names(spec: PipelineSpec) -> list[str]:
    """The target's columns before lineage, in order."""
    return [c.name for c in spec.stored_columns]


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


def evolve_target(conn: Connection, spec: PipelineSpec) -> None:
    """Bring the target to the spec's columns where `target.evolve` allows it (evolve.py), in the
    caller's transaction; refuse a target that disagrees otherwise."""
    target = dict(schema=spec.target_schema, table=spec.target_table)
    actual = {r.column_name: r.type for r in conn.execute(text(query("table_columns")), target)}
    change = plan_evolution(actual, spec.stored_columns + LINEAGE, spec.evolve == "additive")
    if change.problems:
        raise SpecError(f"target table {spec.target_schema}.{spec.target_table} disagrees with the spec: "
                        f"{'; '.join(change.problems)}")
    for c in change.add:
        conn.execute(text(query("add_column", column=c.name, type=Fragment(c.pg_type), **target)))
        log.info("%s.%s: added column %s %s", spec.target_schema, spec.target_table, c.name, c.pg_type)
    for c in change.widen:
        conn.execute(text(query("widen_column", column=c.name, type=Fragment(c.pg_type), **target)))
        log.info("%s.%s: widened column %s to %s", spec.target_schema, spec.target_table, c.name, c.pg_type)


def staging_complete(conn: Connection, spec: PipelineSpec, staging: str) -> bool:
    """Both staging tables exist, the good rows carry their batch id (an earlier version staged into
    one table without it) and every column the spec has now (it may have changed since staging)."""
    return conn.execute(text(query("staging_complete")), {"staging": staging, "bad": bad_name(staging),
                                                          "columns": column_names(spec) + ["_batch_id"]}).scalar_one()


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

"""The target table: its columns and lineage (from the batch's shape, model/shape.py), its commit lock,
existence, and evolution to the shape's columns (evolve.py)."""
from __future__ import annotations

import logging

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ledgerbatch.commit.evolve import plan_evolution
from ledgerbatch.errors import SpecError
from ledgerbatch.identifiers import quote_ident
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.sqlfiles import Fragment, query

log = logging.getLogger(__name__)


def target_defs(shape: BatchShape) -> Fragment:
    """A target's columns: the shape's, then the lineage, which is never NULL."""
    lineage = [f"{quote_ident(c.name)} {c.pg_type} NOT NULL" for c in shape.lineage]
    return Fragment(",\n    ".join([shape.column_defs] + lineage))


def lock_target(conn: Connection, spec: PipelineSpec) -> None:
    """Order every commit into the pipeline's target for the rest of the transaction (a transaction-level
    advisory lock on the table's name). A live commit, a replay and a backfill each decide what to write
    from what the target holds; only one at a time may decide and write, or a replay could act on a
    target row that a live commit beside it is replacing."""
    conn.execute(text(query("target_lock")), {"target": f"{spec.target_schema}.{spec.target_table}"})


def table_exists(conn: Connection, schema: str, table: str) -> bool:
    return conn.execute(text(query("table_exists")), {"schema": schema, "table": table}).scalar_one()


def evolve_target(conn: Connection, spec: PipelineSpec, shape: BatchShape, at: tuple[str, str] | None = None) -> None:
    """Bring the target (or the table `at`, with the target's columns) to the shape's columns and lineage
    where `target.evolve` allows it (evolve.py), in the caller's transaction; refuse one that disagrees."""
    schema, table = at or (spec.target_schema, spec.target_table)
    target = dict(schema=schema, table=table)
    actual = {r.column_name: r.type for r in conn.execute(text(query("table_columns")), target)}
    change = plan_evolution(actual, shape.columns + shape.lineage, spec.evolve == "additive")
    if change.problems:
        raise SpecError(f"table {schema}.{table} disagrees with the spec: {'; '.join(change.problems)}")
    for c in change.add:
        conn.execute(text(query("add_column", column=c.name, type=Fragment(c.pg_type), **target)))
        log.info("%s.%s: added column %s %s", schema, table, c.name, c.pg_type)
    for c in change.widen:
        conn.execute(text(query("set_column_type", column=c.name, type=Fragment(c.pg_type), **target)))
        log.info("%s.%s: widened column %s to %s", schema, table, c.name, c.pg_type)

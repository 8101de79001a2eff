"""`ledgerbatch verify`: the exactly-once invariants of one pipeline, checked with SQL (sql/queries/verify.sql)."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Engine

from .identifiers import quote_table
from .spec import PipelineSpec
from .sqlfiles import query


def verify(engine: Engine, spec: PipelineSpec) -> list[str]:
    """Every violation found, one line each; empty when the pipeline is consistent."""
    params = {"pipeline": spec.name}
    with engine.connect() as conn:
        target_exists = conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"),
                                     {"t": quote_table(spec.target_schema, spec.target_table)}).scalar_one()
        problems = [row.problem for row in conn.execute(text(query("verify_ledger")), params)]
        if target_exists:
            target = dict(schema=spec.target_schema, table=spec.target_table)
            problems += [row.problem for row in conn.execute(text(query("verify_target_rows", **target)), params)]
            if spec.mode == "append":
                problems += [row.problem for row in conn.execute(text(query("verify_append_counts", **target)), params)]
    return problems

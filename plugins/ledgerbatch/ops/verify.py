"""`ledgerbatch verify`: the exactly-once invariants of one pipeline, checked with SQL
(sql/queries/ledger_verify.sql)."""
from __future__ import annotations

from sqlalchemy.engine import Engine

from ledgerbatch.commit.modes.catalog import mode_for
from ledgerbatch.commit.target import table_exists
from ledgerbatch.ledger.inspection import violations
from ledgerbatch.spec.pipeline import PipelineSpec


def verify(engine: Engine, spec: PipelineSpec) -> list[str]:
    """Every violation found, one line each; empty when the pipeline is consistent."""
    with engine.connect() as conn:
        problems = violations(conn, spec.name)
        if table_exists(conn, spec.target_schema, spec.target_table):
            problems += mode_for(spec).violations(conn, spec)
    return problems

"""`ledgerbatch verify`: the exactly-once invariants of one pipeline, checked with SQL (sql/queries/ledger_verify.sql)."""
from __future__ import annotations

from sqlalchemy.engine import Engine

from . import ledger, tables
from .modes import mode_for
from .spec import PipelineSpec


def verify(engine: Engine, spec: PipelineSpec) -> list[str]:
    """Every violation found, one line each; empty when the pipeline is consistent."""
    with engine.connect() as conn:
        problems = ledger.violations(conn, spec.name)
        if tables.table_exists(conn, spec.target_schema, spec.target_table):
            problems += mode_for(spec).violations(conn, spec)
    return problems

"""A dry run of `ledgerbatch quarantine purge` (the history DAG's Purge quarantine before with Dry run): the
purge itself, in a transaction rolled back, so the count is exactly what the purge would delete then."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy.engine import Engine

from ledgerbatch.ledger import compaction
from ledgerbatch.spec.pipeline import PipelineSpec


def purge_count(engine: Engine, spec: PipelineSpec, before: datetime) -> int:
    """How many of the pipeline's quarantined records a purge before `before` would delete; nothing changes."""
    with engine.connect() as conn:
        transaction = conn.begin()
        try:
            return compaction.purge_quarantine(conn, spec.name, before)
        finally:
            transaction.rollback()

"""Apply `sql/migrations` in order, each once, each in its own transaction; safe to run concurrently."""
from __future__ import annotations

import logging

from sqlalchemy.engine import Engine

from . import ledger
from .sqlfiles import migrations

log = logging.getLogger(__name__)


def migrate(engine: Engine) -> list[int]:
    applied_now = []
    with engine.begin() as conn:
        ledger.bootstrap(conn)
    for version, name, sql in migrations():
        with engine.begin() as conn:
            ledger.lock_migrations(conn)
            if version in ledger.applied_migrations(conn):
                continue
            conn.exec_driver_sql(sql)
            ledger.record_migration(conn, version, name)
            applied_now.append(version)
            log.info("applied migration %03d_%s", version, name)
    return applied_now


def pending(engine: Engine) -> list[int]:
    """Migrations not yet applied (all of them when the ledger schema does not exist)."""
    with engine.connect() as conn:
        done = ledger.applied_migrations(conn)
    return [v for v, _, _ in migrations() if v not in done]

"""Apply `sql/migrations` in order, each once, each in its own transaction; safe to run concurrently."""
from __future__ import annotations

import logging

from sqlalchemy import text
from sqlalchemy.engine import Engine

from .sqlfiles import migrations, query

log = logging.getLogger(__name__)


def migrate(engine: Engine) -> list[int]:
    applied_now = []
    with engine.begin() as conn:
        conn.execute(text(query("migration_lock")))
        conn.exec_driver_sql(query("bootstrap"))
    for version, name, sql in migrations():
        with engine.begin() as conn:
            conn.execute(text(query("migration_lock")))
            done = {row.version for row in conn.execute(text(query("applied_migrations")))}
            if version in done:
                continue
            conn.exec_driver_sql(sql)
            conn.execute(text(query("record_migration")), {"version": version, "name": name})
            applied_now.append(version)
            log.info("applied migration %03d_%s", version, name)
    return applied_now


def pending(engine: Engine) -> list[int]:
    """Migrations not yet applied (all of them when the ledger schema does not exist)."""
    with engine.connect() as conn:
        exists = conn.execute(text("SELECT to_regclass('ledger.schema_migrations') IS NOT NULL")).scalar_one()
        done = {row.version for row in conn.execute(text(query("applied_migrations")))} if exists else set()
    return [v for v, _, _ in migrations() if v not in done]

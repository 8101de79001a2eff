"""Apply `sql/migrations` in order, each once, each in its own transaction; safe to run concurrently.
The ledger's own bookkeeping of them is `ledger.schema_migrations` (sql/queries/ledger_migrations.sql)."""
from __future__ import annotations

import logging

from sqlalchemy.engine import Connection, Engine

from ledgerbatch.ledger.sql import run
from ledgerbatch.sqlfiles import migrations, query

log = logging.getLogger(__name__)


def migrate(engine: Engine) -> list[int]:
    applied_now = []
    with engine.begin() as conn:
        bootstrap(conn)
    for version, name, sql in migrations():
        with engine.begin() as conn:
            lock_migrations(conn)
            if version in applied_migrations(conn):
                continue
            conn.exec_driver_sql(sql)
            record_migration(conn, version, name)
            applied_now.append(version)
            log.info("applied migration %03d_%s", version, name)
    return applied_now


def pending(engine: Engine) -> list[int]:
    """Migrations not yet applied (all of them when the ledger schema does not exist)."""
    with engine.connect() as conn:
        done = applied_migrations(conn)
    return [v for v, _, _ in migrations() if v not in done]


def bootstrap(conn: Connection) -> None:
    """The ledger schema and its migrations table, under the migration lock."""
    run(conn, "migration_lock")
    conn.exec_driver_sql(query("bootstrap"))


def lock_migrations(conn: Connection) -> None:
    run(conn, "migration_lock")


def applied_migrations(conn: Connection) -> set[int]:
    if not run(conn, "ledger_exists").scalar_one():
        return set()
    return {row.version for row in run(conn, "applied_migrations")}


def record_migration(conn: Connection, version: int, name: str) -> None:
    run(conn, "record_migration", {"version": version, "name": name})

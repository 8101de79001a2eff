"""Apply `sql/migrations` in order, each once, each in its own transaction; safe to run concurrently.
The ledger's own bookkeeping of them is `ledger.schema_migrations` (sql/queries/ledger_migrations.sql).
One step needs Python after them: redacting spec texts stored before #51 (redact_spec_texts)."""
from __future__ import annotations

import logging

from sqlalchemy.engine import Connection, Engine

from ledgerbatch.ledger.sql import run
from ledgerbatch.spec.pipeline import redacted_spec_text, version_of
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
    with engine.begin() as conn:
        lock_migrations(conn)
        redact_spec_texts(conn)
    return applied_now


def redact_spec_texts(conn: Connection) -> int:
    """Spec texts stored before #51 kept a spec's registry credentials, and their versions hashed them. Each
    such text is redacted as canonical_text does now and re-keyed, with the batches pinned to it, under the
    version its redacted text hashes to: the version the same spec file has now, so a batch planned before
    the upgrade still runs. SQL cannot do it (the text is Python's JSON, which SQL cannot write again byte for
    byte, and the version hashes those bytes). Idempotent: a redacted text is left as it is. Returns how many
    texts it redacted."""
    redacted = 0
    for row in run(conn, "stored_spec_texts").all():
        text = redacted_spec_text(row.spec_text)
        if text == row.spec_text:
            continue
        keys = {"pipeline": row.pipeline, "old": row.version, "new": version_of(text), "spec_text": text}
        for name in ("rekey_spec_version", "repin_spec_version", "drop_spec_version"):
            run(conn, name, keys)
        log.info("redacted the stored text of spec %s version %s (now version %s)", row.pipeline, row.version,
                 keys["new"])
        redacted += 1
    return redacted


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

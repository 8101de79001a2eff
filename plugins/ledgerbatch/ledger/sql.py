"""Running a named query (sql/queries/) on a connection: the one helper every ledger module uses."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ledgerbatch.sqlfiles import query


def run(conn: Connection, name: str, params: dict | list | None = None, **identifiers):
    return conn.execute(text(query(name, **identifiers)), params or {})

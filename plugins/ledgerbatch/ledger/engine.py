"""The ledger database engine, with errors that name the server but never its password."""
from __future__ import annotations

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from ledgerbatch.config import safe_url
from ledgerbatch.errors import ConfigError, UnavailableError
from ledgerbatch.sqlfiles import query


def make_engine(url: str, pool_size: int = 5, max_overflow: int = 10) -> Engine:
    try:
        engine = create_engine(url, pool_pre_ping=True, hide_parameters=True, pool_size=pool_size,
                               max_overflow=max_overflow)
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(f"LEDGERBATCH_DB_URL {safe_url(url)!r} is not a valid SQLAlchemy URL: {exc}") from None
    if engine.dialect.name != "postgresql":
        raise ConfigError(f"LEDGERBATCH_DB_URL must point to PostgreSQL, got {engine.dialect.name}")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise UnavailableError(f"database {safe_url(url)} is not reachable: {reason}", "database") from None
    return engine


def fresh_database(server_url: str, name: str) -> str:
    """Drop and create database `name` on the server of `server_url` (demo, tests, bench); returns its URL."""
    make_engine(server_url).dispose()  # a clear error when the server is not reachable
    admin = create_engine(make_url(server_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(query("drop_database", database=name)))
            conn.execute(text(query("create_database", database=name)))
    finally:
        admin.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)

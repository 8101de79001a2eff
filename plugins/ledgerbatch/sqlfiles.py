"""Access to `sql/`: numbered migrations and named queries (`-- name: x` blocks)."""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from ledgerbatch.config import shipped
from ledgerbatch.identifiers import quote_ident

SQL_DIR = Path(os.environ.get("LEDGERBATCH_SQL_DIR") or shipped("sql"))
_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.M)
_MIGRATION = re.compile(r"^(\d{3})_(\w+)\.sql$")


@functools.cache
def _queries() -> dict[str, str]:
    out: dict[str, str] = {}
    for path in sorted((SQL_DIR / "queries").glob("*.sql")):
        chunks = _NAME.split(path.read_text())
        for name, body in zip(chunks[1::2], chunks[2::2]):
            if name in out:
                raise RuntimeError(f"query {name} is defined twice in {SQL_DIR / 'queries'}")
            out[name] = body.strip()
    return out


def query(name: str, **identifiers: str | list[str] | tuple[str, ...]) -> str:
    """A named query; `{placeholders}` take validated, quoted identifiers (or comma lists of them) only."""
    text = _queries()[name]
    if identifiers:
        text = text.format(**{k: _quoted(v) for k, v in identifiers.items()})
    return text


class Fragment(str):
    """SQL text built only from quoted identifiers and fixed type names; inserted as is."""


def _quoted(value: str | list[str] | tuple[str, ...]) -> str:
    if isinstance(value, Fragment):
        return value
    if isinstance(value, str):
        return quote_ident(value)
    return ", ".join(quote_ident(v) for v in value)


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration, in order."""
    out = []
    for path in sorted((SQL_DIR / "migrations").glob("*.sql")):
        m = _MIGRATION.match(path.name)
        if not m:
            raise RuntimeError(f"migration file {path.name} must be named NNN_name.sql")
        out.append((int(m.group(1)), m.group(2), path.read_text()))
    versions = [v for v, _, _ in out]
    if len(set(versions)) != len(versions):
        raise RuntimeError("two migrations share a version number")
    return out

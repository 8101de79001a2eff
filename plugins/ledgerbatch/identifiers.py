"""Validation and quoting of SQL identifiers that come from configuration."""
from __future__ import annotations

import re

from ledgerbatch.errors import SpecError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def check_ident(name: str, what: str) -> str:
    """Accept plain SQL identifiers only: letters, digits and underscores, 63 bytes at most."""
    if not isinstance(name, str) or not _IDENT.match(name):
        raise SpecError(f"{what} {name!r} is not a valid identifier (letters, digits, _; not starting with a digit)")
    return name


def quote_ident(name: str) -> str:
    return '"' + check_ident(name, "identifier") + '"'


def qualified(table: str, what: str = "table") -> tuple[str, str]:
    """Split `schema.table` (schema defaults to public) and validate both parts."""
    parts = table.split(".") if isinstance(table, str) else [table]
    if len(parts) == 1:
        parts = ["public", parts[0]]
    if len(parts) != 2:
        raise SpecError(f"{what} {table!r} must be `table` or `schema.table`")
    return check_ident(parts[0], f"{what} schema"), check_ident(parts[1], f"{what} name")


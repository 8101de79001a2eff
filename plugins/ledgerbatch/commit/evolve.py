"""Schema evolution of a target (pure): what the spec's columns need of the table as it is.

`target.evolve: additive` adds a column the table lacks (nullable) and widens a column whose type
the spec widened (SMALLINT -> INT -> BIGINT, FLOAT -> DOUBLE, a DECIMAL with more digits on either
side of the point); anything else is refused, so nothing is ever narrowed or reinterpreted. A text column
the user narrowed to `varchar(n)` is accepted as it is: the target refuses values longer than n, and
`errors.on_reject` says what becomes of their rows (commit/rejects.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ledgerbatch.formats.schema import Column

_NUMERIC = re.compile(r"^numeric\((\d+),(\d+)\)$")
_NARROWED_TEXT = re.compile(r"^character varying\(\d+\)$")
_WIDER = {"smallint": ("integer", "bigint"), "integer": ("bigint",), "real": ("double precision",)}


@dataclass(frozen=True)
class Evolution:
    add: tuple[Column, ...] = ()
    widen: tuple[Column, ...] = ()
    problems: tuple[str, ...] = field(default=())


def format_type(col: Column) -> str:
    """The column's type as PostgreSQL's format_type() writes it."""
    return col.pg_type.replace("timestamptz", "timestamp with time zone")


def plan_evolution(actual: dict[str, str], columns: tuple[Column, ...], additive: bool) -> Evolution:
    """`actual`: column name -> format_type of the table as it is."""
    add, widen, problems = [], [], []
    for c in columns:
        want, have = format_type(c), actual.get(c.name)
        if have == want or (want == "text" and have is not None and _NARROWED_TEXT.match(have)):
            continue
        if have is None:
            (add if additive else problems).append(c if additive else f"{c.name} is missing")
        elif additive and widens(have, want):
            widen.append(c)
        else:
            problems.append(f"{c.name} is {have}, the spec says {c.pg_type}")
    return Evolution(tuple(add), tuple(widen), tuple(problems))


def widens(have: str, want: str) -> bool:
    if want in _WIDER.get(have, ()):
        return True
    old, new = _NUMERIC.match(have), _NUMERIC.match(want)
    if old and new:
        (p, s), (p2, s2) = map(int, old.groups()), map(int, new.groups())
        return s2 >= s and p2 - s2 >= p - s
    return False

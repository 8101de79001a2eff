"""The spec's Spark DDL schema: parsed without a JVM, mapped to Spark, Arrow and PostgreSQL types."""
from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import SpecError
from .identifiers import check_ident

_SIMPLE = {
    "STRING": "text",
    "BOOLEAN": "boolean",
    "SMALLINT": "smallint",
    "INT": "integer",
    "INTEGER": "integer",
    "BIGINT": "bigint",
    "FLOAT": "real",
    "DOUBLE": "double precision",
    "DATE": "date",
    "TIMESTAMP": "timestamptz",
}
_ALIASES = {"INTEGER": "INT", "LONG": "BIGINT", "SHORT": "SMALLINT", "BOOL": "BOOLEAN", "REAL": "FLOAT"}
_DECIMAL = re.compile(r"^DECIMAL\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)$|^DECIMAL$")


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # canonical Spark type name: STRING, INT, ..., DECIMAL
    precision: int = 0
    scale: int = 0

    @property
    def spark_ddl(self) -> str:
        if self.type == "DECIMAL":
            return f"DECIMAL({self.precision},{self.scale})"
        return self.type

    @property
    def pg_type(self) -> str:
        if self.type == "DECIMAL":
            return f"numeric({self.precision},{self.scale})"
        return _SIMPLE[self.type]


# Lineage, defined once: the source coordinates every staged row carries, and the batch that delivered it.
COORDINATES = (Column("_topic", "STRING"), Column("_partition", "INT"), Column("_offset", "BIGINT"))
BATCH_ID = Column("_batch_id", "BIGINT")
LINEAGE = COORDINATES + (BATCH_ID,)
COORDINATE_NAMES = tuple(c.name for c in COORDINATES)


def parse_schema(ddl: str) -> tuple[Column, ...]:
    """Parse `name TYPE, name TYPE, ...` (the subset of Spark DDL that maps onto PostgreSQL columns)."""
    if not isinstance(ddl, str) or not ddl.strip():
        raise SpecError("source.schema must be a non-empty Spark DDL string such as 'id STRING, amount DECIMAL(12,2)'")
    columns, seen = [], set()
    for field in _split_top_level(ddl):
        bits = field.strip().split(None, 1)
        if len(bits) != 2:
            raise SpecError(f"source.schema field {field.strip()!r} must be `name TYPE`")
        name, type_text = bits[0].strip("`"), bits[1].strip().upper()
        check_ident(name, "column")
        if name.startswith("_"):
            raise SpecError(f"column {name!r}: names starting with _ are reserved for lineage columns")
        if name.lower() in seen:
            raise SpecError(f"column {name!r} appears twice in source.schema")
        seen.add(name.lower())
        columns.append(_column(name, type_text))
    return tuple(columns)


def _column(name: str, type_text: str) -> Column:
    type_text = _ALIASES.get(type_text, type_text)
    if type_text in _SIMPLE:
        return Column(name, type_text)
    m = _DECIMAL.match(type_text)
    if m:
        precision, scale = (int(m.group(1)), int(m.group(2))) if m.group(1) else (10, 0)
        if not 1 <= precision <= 38 or scale > precision:
            raise SpecError(f"column {name!r}: DECIMAL({precision},{scale}) needs 1 <= precision <= 38 and scale <= precision")
        return Column(name, "DECIMAL", precision, scale)
    supported = ", ".join(sorted(set(_SIMPLE) - {"INTEGER"})) + ", DECIMAL(p,s)"
    raise SpecError(f"column {name!r}: type {type_text!r} is not supported (use one of {supported})")


def _split_top_level(ddl: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in ddl:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]

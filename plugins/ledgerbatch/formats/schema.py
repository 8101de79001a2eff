"""The spec's Spark DDL schema: parsed without a JVM, mapped to PostgreSQL types and to the staged form.

Scalars map to their PostgreSQL type; `BINARY` to bytea; `ARRAY<scalar>` to an array of the scalar;
`STRUCT<...>`, `MAP<...>`, `VARIANT` and arrays of complex types to jsonb. Everything that is not a
plain scalar is staged as text (bytea hex, an array literal or JSON) and typed by the COPY.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ledgerbatch.errors import SpecError
from ledgerbatch.identifiers import check_ident

_SCALARS = {
    "STRING": "text",
    "BOOLEAN": "boolean",
    "SMALLINT": "smallint",
    "INT": "integer",
    "BIGINT": "bigint",
    "FLOAT": "real",
    "DOUBLE": "double precision",
    "DATE": "date",
    "TIMESTAMP": "timestamptz",
    "BINARY": "bytea",
}
_ALIASES = {"INTEGER": "INT", "LONG": "BIGINT", "SHORT": "SMALLINT", "BOOL": "BOOLEAN", "REAL": "FLOAT"}
_DECIMAL = re.compile(r"^DECIMAL\s*(?:\(\s*(\d+)\s*,\s*(\d+)\s*\))?$")
_COMPLEX = ("STRUCT", "MAP", "VARIANT")
_SUPPORTED = ", ".join(sorted(_SCALARS)) + ", DECIMAL(p,s), ARRAY<T>, MAP<K,V>, STRUCT<name: T, ...>, VARIANT"


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # canonical Spark type name: STRING, INT, ..., DECIMAL, BINARY, ARRAY, MAP, STRUCT, VARIANT
    precision: int = 0
    scale: int = 0
    children: tuple["Column", ...] = ()  # ARRAY: (element,); MAP: (key, value); STRUCT: its fields

    @property
    def spark_ddl(self) -> str:
        if self.type == "DECIMAL":
            return f"DECIMAL({self.precision},{self.scale})"
        if self.type == "ARRAY":
            return f"ARRAY<{self.children[0].spark_ddl}>"
        if self.type == "MAP":
            return f"MAP<{self.children[0].spark_ddl}, {self.children[1].spark_ddl}>"
        if self.type == "STRUCT":
            return "STRUCT<" + ", ".join(f"{c.name}: {c.spark_ddl}" for c in self.children) + ">"
        return self.type

    @property
    def is_scalar(self) -> bool:
        return self.type in _SCALARS or self.type == "DECIMAL"

    @property
    def is_json(self) -> bool:
        """Stored as jsonb: structs, maps, variants and arrays of anything but scalars."""
        return self.type in _COMPLEX or (self.type == "ARRAY" and not self.children[0].is_scalar)

    @property
    def staged_as_text(self) -> bool:
        """Staged as text and typed by the COPY (bytea hex, array literal, JSON)."""
        return not self.is_scalar or self.type == "BINARY"

    @property
    def pg_type(self) -> str:
        if self.is_json:
            return "jsonb"
        if self.type == "ARRAY":
            return self.children[0].pg_type + "[]"
        if self.type == "DECIMAL":
            return f"numeric({self.precision},{self.scale})"
        return _SCALARS[self.type]


# Lineage, defined once: the source coordinates every staged row carries, and the batch that delivered it.
COORDINATES = (Column("_topic", "STRING"), Column("_partition", "INT"), Column("_offset", "BIGINT"))
BATCH_ID = Column("_batch_id", "BIGINT")
LINEAGE = COORDINATES + (BATCH_ID,)
COORDINATE_NAMES = tuple(c.name for c in COORDINATES)
# Kafka metadata a spec may ask for as columns (source.metadata): the raw key, the record timestamp,
# the headers as [{"key": ..., "value": ...}] (see docs/formats.md).
METADATA = {"key": Column("_key", "BINARY"), "timestamp": Column("_timestamp", "TIMESTAMP"),
            "headers": Column("_headers", "VARIANT")}


# The column types the binary COPY encodes (stage/binary_copy.py): these, and numeric(p,s) up to
# numeric(18,16) (unscaled values and the padded fraction fit an int64). Arrays and bytea have no encoder.
BINARY_COPY_TYPES = frozenset({"smallint", "integer", "bigint", "real", "double precision", "boolean", "date",
                               "timestamptz", "text", "jsonb"})
MAX_BINARY_DECIMAL = (18, 16)


def binary_encodable(pg_type: str) -> bool:
    """Whether the binary COPY can encode a column of `pg_type` (as staging declares it)."""
    if pg_type.startswith("numeric("):
        precision, scale = (int(x) for x in pg_type[len("numeric("):-1].split(","))
        return precision <= MAX_BINARY_DECIMAL[0] and scale <= MAX_BINARY_DECIMAL[1]
    return pg_type in BINARY_COPY_TYPES


def parse_schema(ddl: str, lineage_names: bool = False) -> tuple[Column, ...]:
    """Parse `name TYPE, name TYPE, ...` (the subset of Spark DDL that maps onto PostgreSQL columns).
    `lineage_names`: a query's output, which may carry metadata columns such as _timestamp."""
    if not isinstance(ddl, str) or not ddl.strip():
        raise SpecError("source.schema must be a non-empty Spark DDL string such as 'id STRING, amount DECIMAL(12,2)'")
    columns = _fields(ddl, "column", lambda f: f.split(None, 1))
    for c in columns if not lineage_names else ():
        if c.name.startswith("_"):
            raise SpecError(f"column {c.name!r}: names starting with _ are reserved for lineage columns")
    return columns


def _fields(text: str, what: str, split) -> tuple[Column, ...]:
    columns, seen = [], set()
    for field in _split_top_level(text):
        bits = split(field.strip())
        if len(bits) != 2 or not bits[1].strip():
            raise SpecError(f"source.schema {what} {field.strip()!r} must be `name TYPE`")
        name = bits[0].strip().strip("`")
        check_ident(name, what)
        if name.lower() in seen:
            raise SpecError(f"{what} {name!r} appears twice in source.schema")
        seen.add(name.lower())
        columns.append(parse_type(name, bits[1].strip()))
    return tuple(columns)


def parse_type(name: str, type_text: str) -> Column:
    upper = _ALIASES.get(type_text.upper(), type_text.upper())
    if upper in _SCALARS or upper == "VARIANT":
        return Column(name, upper)
    m = _DECIMAL.match(upper)
    if m:
        precision, scale = (int(m.group(1)), int(m.group(2))) if m.group(1) else (10, 0)
        if not 1 <= precision <= 38 or scale > precision:
            raise SpecError(f"column {name!r}: DECIMAL({precision},{scale}) needs 1 <= precision <= 38 and scale <= precision")
        return Column(name, "DECIMAL", precision, scale)
    outer, inner = _generic(type_text)
    if outer == "ARRAY":
        return Column(name, "ARRAY", children=(parse_type("element", inner),))
    if outer == "MAP":
        parts = _split_top_level(inner)
        if len(parts) != 2:
            raise SpecError(f"column {name!r}: MAP needs a key and a value type, MAP<K, V>")
        key, value = parse_type("key", parts[0].strip()), parse_type("value", parts[1].strip())
        if not key.is_scalar:
            raise SpecError(f"column {name!r}: MAP keys must be a scalar type, got {key.spark_ddl}")
        return Column(name, "MAP", children=(key, value))
    if outer == "STRUCT":
        return Column(name, "STRUCT", children=_fields(inner, f"{name} field", _struct_field))
    raise SpecError(f"column {name!r}: type {type_text.strip().upper()!r} is not supported (use one of {_SUPPORTED})")


def _generic(type_text: str) -> tuple[str | None, str]:
    """`ARRAY<INT>` -> ("ARRAY", "INT"); anything else -> (None, "")."""
    m = re.match(r"^\s*(ARRAY|MAP|STRUCT)\s*<(.*)>\s*$", type_text, re.I | re.S)
    return (m.group(1).upper(), m.group(2)) if m else (None, "")


def _struct_field(field: str) -> list[str]:
    """`name: TYPE` or `name TYPE`, as Spark's DDL accepts both inside STRUCT<...>."""
    name, sep, rest = field.partition(":")
    if sep and "<" not in name and "(" not in name:
        return [name.strip(), rest.strip()]
    return field.split(None, 1)


def _split_top_level(ddl: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in ddl:
        if ch in "(<":
            depth += 1
        elif ch in ")>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def schema_ddl(columns: tuple[Column, ...]) -> str:
    """The columns as the DDL parse_schema reads."""
    return ", ".join(f"{c.name} {c.spark_ddl}" for c in columns)

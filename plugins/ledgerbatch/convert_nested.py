"""Values of STRUCT, MAP, VARIANT and ARRAY columns: converted field by field as strictly as scalars,
then written in their staged form: JSON text for jsonb columns, an array literal for `ARRAY<scalar>`.

Inside JSON, decimals stay exact numbers, timestamps and dates are ISO-8601 strings and bytes are
base64 strings; a STRUCT keeps its declared fields only, in their declared order.
"""
from __future__ import annotations

import base64
import datetime as dt
import json
import math
import uuid
from decimal import Decimal
from typing import Callable

from .convert import BadValue, binary_bytes, converter, show
from .schema import Column


def nested_converter(col: Column) -> Callable:
    if col.is_json:
        to_json = json_converter(col)
        return lambda v: dumps(to_json(v))
    element = converter(col.children[0])  # ARRAY<scalar>
    return lambda v: array_literal([None if x is None else _at(f"[{i}]", element, x) for i, x in enumerate(_items(v))])


def json_converter(col: Column) -> Callable:
    """v -> a JSON-able value of the column's type (Decimal kept exact)."""
    if col.type == "STRUCT":
        fields = [(f.name, json_converter(f)) for f in col.children]
        return lambda v: _struct(v, fields)
    if col.type == "MAP":
        key, value = _map_key(col.children[0]), json_converter(col.children[1])
        return lambda v: _map(v, key, value)
    if col.type == "ARRAY":
        element = json_converter(col.children[0])
        return lambda v: [None if x is None else _at(f"[{i}]", element, x) for i, x in enumerate(_items(v))]
    if col.type == "VARIANT":
        return _variant
    if col.type == "BINARY":
        return lambda v: base64.b64encode(binary_bytes(v)).decode()
    scalar = converter(col)
    return lambda v: _scalar_json(scalar(v))


def _at(step: str, convert: Callable, v):
    try:
        return convert(v)
    except BadValue as exc:
        raise BadValue(str(exc), (step,) + exc.path) from None
    except (ValueError, OverflowError, ArithmeticError) as exc:
        raise BadValue(f"{show(v)} does not convert ({exc})", (step,)) from None


def _struct(v, fields):
    if not isinstance(v, dict):
        raise BadValue(f"expected an object (STRUCT), got {show(v)}")
    return {name: None if v.get(name) is None else _at(f".{name}", convert, v[name]) for name, convert in fields}


def _map(v, key, value):
    if not isinstance(v, dict):
        raise BadValue(f"expected an object (MAP), got {show(v)}")
    return {key(k): None if x is None else _at(f"[{k}]", value, x) for k, x in v.items()}


def _map_key(col: Column) -> Callable:
    """Map keys are text in JSON: a numeric or boolean key type is read from that text."""
    scalar = converter(col)

    def convert(k) -> str:
        if isinstance(k, str) and col.type in ("SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE", "DECIMAL", "BOOLEAN"):
            try:
                k = json.loads(k, parse_float=Decimal)
            except (ValueError, ArithmeticError):  # ArithmeticError: an exponent past Decimal's
                raise BadValue(f"map key {show(k)} is not of type {col.spark_ddl}") from None
        converted = scalar(k)
        return _array_text(converted) if not isinstance(converted, str) else converted
    return convert


def _items(v) -> list:
    if not isinstance(v, (list, tuple)):
        raise BadValue(f"expected an array, got {show(v)}")
    return list(v)


def _scalar_json(v):
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    return v


def _variant(v):
    """Any value as JSON: natives of registry formats written the way they would be in JSON."""
    if isinstance(v, dict):
        return {str(k): _variant(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_variant(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(v).decode()
    if isinstance(v, uuid.UUID):
        return str(v)
    return _scalar_json(v)


def dumps(v) -> str:
    """JSON text for jsonb, with decimals written exactly (json.dumps would need floats)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        if "\x00" in v:
            raise BadValue("contains a NUL character, which PostgreSQL jsonb cannot store")
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, Decimal):
        if not v.is_finite():
            raise BadValue(f"{v} is not a finite number: JSON has no place for it")
        return format(v, "f")
    if isinstance(v, float):
        if not math.isfinite(v):
            raise BadValue(f"{v} is not a finite number: JSON has no place for it")
        return repr(v)
    if isinstance(v, dict):
        return "{" + ",".join(f"{dumps(str(k))}:{dumps(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(dumps(x) for x in v) + "]"
    raise BadValue(f"{show(v)} has no JSON form")


def array_literal(values: list) -> str:
    """A PostgreSQL array literal of converted scalars: every element quoted, NULL unquoted."""
    return "{" + ",".join("NULL" if v is None else '"' + _array_text(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
                          for v in values) + "}"


def _array_text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Decimal):
        return format(v, "f")
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    return str(v)

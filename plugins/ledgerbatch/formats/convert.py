"""Strict conversion of decoded scalar values to the spec's column types, or a quarantine reason.

Decoders hand over Python values: JSON's str/int/Decimal/bool/list/dict, or a registry format's
native values (float, bytes, datetime, date, UUID). Each converter accepts what a user would call
that type and refuses the rest.

Nested values (STRUCT, MAP, VARIANT, ARRAY, below the scalars) are converted field by field as
strictly as scalars, then written in their staged form: JSON text for jsonb columns, an array literal
for `ARRAY<scalar>`. Inside JSON, decimals stay exact numbers, timestamps and dates are ISO-8601
strings and bytes are base64 strings; a STRUCT keeps its declared fields only, in their declared order.
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
import uuid
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Callable

from ledgerbatch.formats.bad_value import BadValue
from ledgerbatch.formats.schema import Column

INT_BOUNDS = {"SMALLINT": 2**15, "INT": 2**31, "BIGINT": 2**63}  # also the chunk paths' (avro_columns.py)
_FLOAT_MAX = 3.4028234663852886e38
# How deep a VARIANT value may nest. Deeper is a bad record ("nested too deeply"): converting and writing
# it recurse about four Python frames a level, and a record must never exhaust the task's stack.
MAX_DEPTH = 200
_WIDE = Context(prec=100)  # room to round any value that can fit DECIMAL(38, s) before the range check
# The range of Python's datetime and date, which every TIMESTAMP and DATE value passes through here: in
# microseconds and days since the epoch, for the chunk paths (json_columns.py, avro_columns.py).
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
MIN_US = (dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc) - _EPOCH) // dt.timedelta(microseconds=1)
MAX_US = (dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone.utc) - _EPOCH) // dt.timedelta(microseconds=1)
MIN_DAY, MAX_DAY = (dt.date(1, 1, 1) - _EPOCH.date()).days, (dt.date(9999, 12, 31) - _EPOCH.date()).days


def _to_string(v):
    if isinstance(v, str):
        if "\x00" in v:
            raise BadValue("contains a NUL character, which PostgreSQL text cannot store")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise BadValue("contains an unpaired UTF-16 surrogate escape, which is not text") from None
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, Decimal, float, uuid.UUID)):  # uuid: Avro's logical type
        return str(v)
    if isinstance(v, dt.time):  # Avro time-millis/micros
        return v.isoformat()
    if isinstance(v, (list, dict)):
        raise BadValue(f"expected a string, got a JSON {'array' if isinstance(v, list) else 'object'}")
    raise BadValue(f"expected a string, got {show(v)}")


def _int_converter(bound: int):
    def convert(v):
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadValue(f"expected an integer, got {show(v)}")
        if not -bound <= v < bound:
            raise BadValue("integer out of range")
        return v
    return convert


def _float_converter(limit: float | None):
    def convert(v):
        if isinstance(v, bool) or not isinstance(v, (int, Decimal, float)):
            raise BadValue(f"expected a number, got {show(v)}")
        f = float(v)
        if isinstance(v, Decimal) and not math.isfinite(f) or limit is not None and abs(f) > limit:
            raise BadValue("number out of range")
        return f
    return convert


def _decimal_converter(col: Column):
    quantum = Decimal(1).scaleb(-col.scale)
    limit = Decimal(10) ** (col.precision - col.scale)

    def convert(v):
        if isinstance(v, bool) or not isinstance(v, (int, Decimal, str, float)):
            raise BadValue(f"expected a decimal number, got {show(v)}")
        try:  # a float by its shortest repr (0.1 is 0.1, not its binary expansion); text may have spaces around
            d = Decimal(repr(v)) if isinstance(v, float) else Decimal(v)
        except InvalidOperation:
            raise BadValue(f"{show(v)} is not a decimal number") from None
        if not d.is_finite():
            raise BadValue(f"{show(v)} is not a finite number")
        # A huge value is refused below unrounded; a zero's exponent says nothing of its size (0E+48).
        d = d.quantize(quantum, rounding=ROUND_HALF_UP, context=_WIDE) if d.adjusted() < 40 or not d else d
        if abs(d) >= limit:
            raise BadValue(f"{show(v)} does not fit DECIMAL({col.precision},{col.scale})")
        return d
    return convert


def _to_bool(v):
    if not isinstance(v, bool):
        raise BadValue(f"expected true or false, got {show(v)}")
    return v


def _to_timestamp(v):
    if isinstance(v, dt.datetime):  # Avro timestamp-millis/micros, protobuf Timestamp
        return v.replace(tzinfo=dt.timezone.utc) if v.tzinfo is None else v.astimezone(dt.timezone.utc)
    if not isinstance(v, str):
        raise BadValue(f"expected an ISO-8601 timestamp string, got {show(v)}")
    try:
        ts = dt.datetime.fromisoformat(v)
    except ValueError:
        raise BadValue(f"{show(v)} is not an ISO-8601 timestamp") from None
    # Naive timestamps are taken as UTC, the session time zone of every ledgerbatch job.
    return ts.replace(tzinfo=dt.timezone.utc) if ts.tzinfo is None else ts.astimezone(dt.timezone.utc)


def _to_date(v):
    if isinstance(v, dt.date) and not isinstance(v, dt.datetime):  # Avro date
        return v
    if not isinstance(v, str):
        raise BadValue(f"expected an ISO-8601 date string, got {show(v)}")
    try:
        return dt.date.fromisoformat(v)
    except ValueError:
        raise BadValue(f"{show(v)} is not an ISO-8601 date") from None


def binary_bytes(v) -> bytes:
    """BINARY: bytes as they are; a JSON string as base64 (what Spark's JSON reader expects)."""
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if not isinstance(v, str):
        raise BadValue(f"expected bytes or a base64 string, got {show(v)}")
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise BadValue(f"{show(v)} is not base64") from None


def _to_bytea(v) -> str:
    return "\\x" + binary_bytes(v).hex()  # bytea's hex input form


def show(v) -> str:
    """What a value is, never what it holds: a record's error is read by the inspector, who may not read the
    records themselves (migration 017); the record stays in ledger.quarantine.value for whoever may."""
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, (float, Decimal)):
        return "a number"
    if isinstance(v, str):
        return f"a string of {_count(len(v), 'character')}"
    if isinstance(v, (bytes, bytearray)):
        return _count(len(v), "byte")
    if isinstance(v, dict):
        return f"an object of {_count(len(v), 'key')}"
    if isinstance(v, (list, tuple)):
        return f"an array of {_count(len(v), 'item')}"
    return f"a {type(v).__name__}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def converter(col: Column) -> Callable:
    """The converter of a column's (or a nested field's) values to what is staged for it."""
    if not col.is_scalar:
        return nested_converter(col)
    if col.type in INT_BOUNDS:
        return _int_converter(INT_BOUNDS[col.type])
    return {
        "STRING": lambda c: _to_string,
        "BOOLEAN": lambda c: _to_bool,
        "FLOAT": lambda c: _float_converter(_FLOAT_MAX),
        "DOUBLE": lambda c: _float_converter(None),
        "DECIMAL": _decimal_converter,
        "TIMESTAMP": lambda c: _to_timestamp,
        "DATE": lambda c: _to_date,
        "BINARY": lambda c: _to_bytea,
    }[col.type](col)


# -- nested values

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
        raise BadValue(f"{show(v)} does not convert ({type(exc).__name__})", (step,)) from None


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


def _variant(v, depth: int = 0):
    """Any value as JSON: natives of registry formats written the way they would be in JSON."""
    if isinstance(v, (dict, list, tuple)) and depth >= MAX_DEPTH:
        raise BadValue(f"nested too deeply (more than {MAX_DEPTH} levels)")
    if isinstance(v, dict):
        return {str(k): _variant(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_variant(x, depth + 1) for x in v]
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

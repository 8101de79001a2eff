"""Strict conversion of decoded scalar values to the spec's column types, or a quarantine reason.

Decoders hand over Python values: JSON's str/int/Decimal/bool/list/dict, or a registry format's
native values (float, bytes, datetime, date, UUID). Each converter accepts what a user would call
that type and refuses the rest. Nested types are in convert_nested.py.
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
import uuid
from decimal import Context, Decimal, InvalidOperation, ROUND_HALF_UP
from typing import Callable

from .schema import Column

_INT_BOUNDS = {"SMALLINT": 2**15, "INT": 2**31, "BIGINT": 2**63}
_FLOAT_MAX = 3.4028234663852886e38
_WIDE = Context(prec=100)  # room to round any value that can fit DECIMAL(38, s) before the range check


class BadValue(ValueError):
    """Why a record is quarantined; `path` locates the value inside a nested field."""

    def __init__(self, message: str, path: tuple[str, ...] = ()):
        super().__init__(message)
        self.path = path


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
            raise BadValue(f"integer {v} is out of range")
        return v
    return convert


def _float_converter(limit: float | None):
    def convert(v):
        if isinstance(v, bool) or not isinstance(v, (int, Decimal, float)):
            raise BadValue(f"expected a number, got {show(v)}")
        f = float(v)
        if isinstance(v, Decimal) and not math.isfinite(f) or limit is not None and abs(f) > limit:
            raise BadValue(f"number {v} is out of range")
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
    text = json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def converter(col: Column) -> Callable:
    """The converter of a column's (or a nested field's) values to what is staged for it."""
    if not col.is_scalar:
        from .convert_nested import nested_converter

        return nested_converter(col)
    if col.type in _INT_BOUNDS:
        return _int_converter(_INT_BOUNDS[col.type])
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

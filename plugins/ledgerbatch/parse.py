"""JSON values -> typed rows, or a quarantine reason. One output row per input record, always."""
from __future__ import annotations

import datetime as dt
import json
from decimal import Context, Decimal, InvalidOperation, ROUND_HALF_UP
from typing import Callable, Iterator

from pyspark.sql.types import (
    BooleanType, DataType, DateType, DecimalType, DoubleType, FloatType, IntegerType, LongType,
    ShortType, StringType, StructField, StructType, TimestampType,
)

from .schema import Column

LINEAGE = (("_topic", StringType()), ("_partition", IntegerType()), ("_offset", LongType()))
# Staging-only columns: why a record is bad, and its raw key/value as bytea hex text (bad records only).
ERROR_COLUMNS = (("_error", StringType()), ("_key", StringType()), ("_value", StringType()))

_SPARK_TYPES: dict[str, Callable[[Column], DataType]] = {
    "STRING": lambda c: StringType(),
    "BOOLEAN": lambda c: BooleanType(),
    "SMALLINT": lambda c: ShortType(),
    "INT": lambda c: IntegerType(),
    "BIGINT": lambda c: LongType(),
    "FLOAT": lambda c: FloatType(),
    "DOUBLE": lambda c: DoubleType(),
    "DATE": lambda c: DateType(),
    "TIMESTAMP": lambda c: TimestampType(),
    "DECIMAL": lambda c: DecimalType(c.precision, c.scale),
}
_INT_BOUNDS = {"SMALLINT": 2**15, "INT": 2**31, "BIGINT": 2**63}
_FLOAT_MAX = 3.4028234663852886e38
_WIDE = Context(prec=100)  # room to round any value that can fit DECIMAL(38, s) before the range check


class BadValue(ValueError):
    pass


def staged_struct(columns: tuple[Column, ...]) -> StructType:
    fields = [StructField(c.name, _SPARK_TYPES[c.type](c), True) for c in columns]
    fields += [StructField(n, t, True) for n, t in LINEAGE + ERROR_COLUMNS]
    return StructType(fields)


def _reject_constant(name: str):
    raise BadValue(f"value is not valid JSON: {name} is not a JSON number")


def _decode(raw: bytes | None) -> dict:
    if raw is None:
        raise BadValue("null value (tombstone)")
    if not raw:
        raise BadValue("empty value")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadValue(f"value is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        obj = json.loads(text, parse_float=Decimal, parse_constant=_reject_constant)
    except RecursionError:
        raise BadValue("value is not valid JSON: nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise BadValue(f"value is not valid JSON: {exc.msg} at char {exc.pos}") from None
    except ValueError as exc:  # e.g. an integer literal longer than Python's digit limit
        raise BadValue(f"value is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadValue(f"value is JSON {type(obj).__name__ if obj is not None else 'null'}, not an object")
    return obj


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
    if isinstance(v, (int, Decimal)):
        return str(v)
    raise BadValue(f"expected a string, got a JSON {'array' if isinstance(v, list) else 'object'}")


def _int_converter(bound: int):
    def convert(v):
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadValue(f"expected an integer, got {_show(v)}")
        if not -bound <= v < bound:
            raise BadValue(f"integer {v} is out of range")
        return v
    return convert


def _float_converter(limit: float | None):
    def convert(v):
        if isinstance(v, bool) or not isinstance(v, (int, Decimal)):
            raise BadValue(f"expected a number, got {_show(v)}")
        f = float(v)
        if limit is not None and abs(f) > limit:
            raise BadValue(f"number {v} is out of range")
        return f
    return convert


def _decimal_converter(col: Column):
    quantum = Decimal(1).scaleb(-col.scale)
    limit = Decimal(10) ** (col.precision - col.scale)

    def convert(v):
        if isinstance(v, bool) or not isinstance(v, (int, Decimal, str)):
            raise BadValue(f"expected a decimal number, got {_show(v)}")
        try:
            d = Decimal(v.strip()) if isinstance(v, str) else Decimal(v)
        except InvalidOperation:
            raise BadValue(f"{_show(v)} is not a decimal number") from None
        if not d.is_finite():
            raise BadValue(f"{_show(v)} is not a finite number")
        d = d.quantize(quantum, rounding=ROUND_HALF_UP, context=_WIDE) if d.adjusted() < 40 else d
        if abs(d) >= limit:
            raise BadValue(f"{_show(v)} does not fit DECIMAL({col.precision},{col.scale})")
        return d
    return convert


def _to_bool(v):
    if not isinstance(v, bool):
        raise BadValue(f"expected true or false, got {_show(v)}")
    return v


def _to_timestamp(v):
    if not isinstance(v, str):
        raise BadValue(f"expected an ISO-8601 timestamp string, got {_show(v)}")
    try:
        ts = dt.datetime.fromisoformat(v)
    except ValueError:
        raise BadValue(f"{_show(v)} is not an ISO-8601 timestamp") from None
    # Naive timestamps are taken as UTC, the session time zone of every ledgerbatch job.
    return ts.replace(tzinfo=dt.timezone.utc) if ts.tzinfo is None else ts.astimezone(dt.timezone.utc)


def _to_date(v):
    if not isinstance(v, str):
        raise BadValue(f"expected an ISO-8601 date string, got {_show(v)}")
    try:
        return dt.date.fromisoformat(v)
    except ValueError:
        raise BadValue(f"{_show(v)} is not an ISO-8601 date") from None


def _show(v) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def converter(col: Column) -> Callable:
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
    }[col.type](col)


def parse_value(raw: bytes | None, columns: tuple[Column, ...], converters: list[Callable]) -> tuple:
    """The typed values of one record (missing or null fields are NULL). Raises BadValue."""
    obj = _decode(raw)
    out = []
    for col, convert in zip(columns, converters):
        v = obj.get(col.name)
        if v is None:
            out.append(None)
            continue
        try:
            out.append(convert(v))
        except BadValue as exc:
            raise BadValue(f"field {col.name}: {exc}") from None
        except (ValueError, OverflowError, ArithmeticError) as exc:  # out of range for the type
            raise BadValue(f"field {col.name}: {_show(v)} does not convert to {col.spark_ddl} ({exc})") from None
    return tuple(out)


def _hex(raw: bytes | None) -> str | None:
    return None if raw is None else "\\x" + raw.hex()


def parse_batches(batches: Iterator, columns: tuple[Column, ...], required: tuple[str, ...] = ()) -> Iterator:
    """mapInArrow body: raw Kafka records -> staged rows (typed, or with `_error` and the raw bytes)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(staged_struct(columns), timezone="UTC")
    converters = [converter(c) for c in columns]
    width = len(columns)
    required_at = [(i, c.name) for i, c in enumerate(columns) if c.name in required]
    empty_row = (None,) * width
    for batch in batches:
        keys, values = batch.column("key").to_pylist(), batch.column("value").to_pylist()
        rows, errors, bad_keys, bad_values = [], [], [], []
        for key, value in zip(keys, values):
            try:
                row = parse_value(value, columns, converters)
                for i, name in required_at:
                    if row[i] is None:
                        raise BadValue(f"field {name}: missing or null, but it is part of the target key")
                rows.append(row)
                errors.append(None)
                bad_keys.append(None)
                bad_values.append(None)
            except BadValue as exc:
                rows.append(empty_row)
                errors.append(str(exc))
                bad_keys.append(_hex(key))
                bad_values.append(_hex(value))
        typed = [pa.array([r[i] for r in rows], schema.field(i).type) for i in range(width)]
        yield pa.RecordBatch.from_arrays(
            typed
            + [batch.column("topic"), batch.column("partition"), batch.column("offset")]
            + [pa.array(errors, pa.string()), pa.array(bad_keys, pa.string()), pa.array(bad_values, pa.string())],
            schema=schema,
        )

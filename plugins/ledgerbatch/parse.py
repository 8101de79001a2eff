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


# One decoder for every record: json.loads with options would build a new one per call.
_DECODER = json.JSONDecoder(parse_float=Decimal, parse_constant=_reject_constant)


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
        obj = _DECODER.decode(text)
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


class Parser:
    """Raw records of one partition -> one Arrow batch of staged rows (typed, or with `_error` and the
    raw bytes as bytea hex text)."""

    def __init__(self, columns: tuple[Column, ...], required: tuple[str, ...] = ()):
        from pyspark.sql.pandas.types import to_arrow_schema

        self.columns = columns
        self.schema = to_arrow_schema(staged_struct(columns), timezone="UTC")
        self.converters = [converter(c) for c in columns]
        self.required_at = [(i, c.name) for i, c in enumerate(columns) if c.name in required]

    def parse(self, topic: str, partition: int, offsets: list[int], keys: list, values: list):
        import pyarrow as pa

        columns, converters, required_at = self.columns, self.converters, self.required_at
        rows, bad = [], {}  # bad: position -> reason
        empty_row = (None,) * len(columns)
        for at, value in enumerate(values):
            try:
                row = parse_value(value, columns, converters)
                for i, name in required_at:
                    if row[i] is None:
                        raise BadValue(f"field {name}: missing or null, but it is part of the target key")
                rows.append(row)
            except BadValue as exc:
                rows.append(empty_row)
                bad[at] = str(exc)
        n = len(values)
        typed = [pa.array(col, self.schema.field(i).type) for i, col in enumerate(zip(*rows))] if rows else \
            [pa.nulls(0, self.schema.field(i).type) for i in range(len(columns))]
        if bad:
            errors = [bad.get(at) for at in range(n)]
            bad_keys = [_hex(keys[at]) if at in bad else None for at in range(n)]
            bad_values = [_hex(values[at]) if at in bad else None for at in range(n)]
            extra = [pa.array(errors, pa.string()), pa.array(bad_keys, pa.string()), pa.array(bad_values, pa.string())]
        else:
            extra = [pa.nulls(n, pa.string())] * 3
        lineage = [pa.repeat(pa.scalar(topic, pa.string()), n), pa.repeat(pa.scalar(partition, pa.int32()), n),
                   pa.array(offsets, pa.int64())]
        return pa.RecordBatch.from_arrays(typed + lineage + extra, schema=self.schema)


def parse_batches(batches: Iterator, columns: tuple[Column, ...], required: tuple[str, ...] = ()) -> Iterator:
    """mapInArrow body: raw Kafka record batches (source.RAW_SCHEMA) -> staged rows."""
    parser = Parser(columns, required)
    for batch in batches:
        if batch.num_rows:
            if len(batch.column("partition").unique()) != 1 or len(batch.column("topic").unique()) != 1:
                raise RuntimeError("a parse task got records of two partitions in one batch")
            yield parser.parse(batch.column("topic")[0].as_py(), batch.column("partition")[0].as_py(),
                               batch.column("offset").to_pylist(), batch.column("key").to_pylist(),
                               batch.column("value").to_pylist())

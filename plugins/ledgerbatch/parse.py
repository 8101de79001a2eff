"""Decoded values -> typed rows, or a quarantine reason. One output row per input record, always.

The format is the decoder's business (decoders/), the types the converters' (convert.py); this
module only lays the result out as the Arrow batch a staging task copies.
"""
from __future__ import annotations

from typing import Callable, Iterator

from pyspark.sql.types import (
    BooleanType, DataType, DateType, DecimalType, DoubleType, FloatType, IntegerType, LongType,
    ShortType, StringType, StructField, StructType, TimestampType,
)

from .convert import BadValue, converter, show
from .decoders import Decoder, make_decoder
from .schema import COORDINATES, Column

# Staging-only columns: why a record is bad, and its raw key/value as bytea hex text (bad records only).
ERROR_COLUMNS = ("_error", "_key", "_value")

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


def staged_struct(columns: tuple[Column, ...]) -> StructType:
    fields = [StructField(c.name, _SPARK_TYPES[c.type](c), True) for c in columns + COORDINATES]
    fields += [StructField(n, StringType(), True) for n in ERROR_COLUMNS]
    return StructType(fields)


def parse_value(raw: bytes | None, decoder: Decoder, columns: tuple[Column, ...], converters: list[Callable]) -> tuple:
    """The typed values of one record (missing or null fields are NULL). Raises BadValue."""
    obj = decoder.decode(raw)
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
            raise BadValue(f"field {col.name}: {show(v)} does not convert to {col.spark_ddl} ({exc})") from None
    return tuple(out)


def _hex(raw: bytes | None) -> str | None:
    return None if raw is None else "\\x" + raw.hex()


class Parser:
    """Raw records of one partition -> one Arrow batch of staged rows (typed, or with `_error` and the
    raw bytes as bytea hex text)."""

    def __init__(self, columns: tuple[Column, ...], required: tuple[str, ...] = (), decoder: Decoder | None = None):
        from pyspark.sql.pandas.types import to_arrow_schema

        self.columns = columns
        self.decoder = decoder or make_decoder("json")
        self.schema = to_arrow_schema(staged_struct(columns), timezone="UTC")
        self.converters = [converter(c) for c in columns]
        self.required_at = [(i, c.name) for i, c in enumerate(columns) if c.name in required]

    def parse(self, topic: str, partition: int, offsets: list[int], keys: list, values: list):
        import pyarrow as pa

        decoder, columns, converters, required_at = self.decoder, self.columns, self.converters, self.required_at
        rows, bad = [], {}  # bad: position -> reason
        empty_row = (None,) * len(columns)
        for at, value in enumerate(values):
            try:
                row = parse_value(value, decoder, columns, converters)
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


def parse_batches(batches: Iterator, columns: tuple[Column, ...], required: tuple[str, ...] = (),
                  fmt: str = "json", options: dict | None = None) -> Iterator:
    """mapInArrow body: raw Kafka record batches (source.RAW_SCHEMA) -> staged rows."""
    parser = Parser(columns, required, make_decoder(fmt, options))
    for batch in batches:
        if batch.num_rows:
            if len(batch.column("partition").unique()) != 1 or len(batch.column("topic").unique()) != 1:
                raise RuntimeError("a parse task got records of two partitions in one batch")
            yield parser.parse(batch.column("topic")[0].as_py(), batch.column("partition")[0].as_py(),
                               batch.column("offset").to_pylist(), batch.column("key").to_pylist(),
                               batch.column("value").to_pylist())

"""Decoded values -> typed rows, or a quarantine reason. One output row per input record, always.

The format is the decoder's business (formats/decoders/), the types the converters' (convert.py); this
module only lays the result out as the Arrow batch a staging task copies.
"""
from __future__ import annotations

import base64
from typing import Callable

from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ledgerbatch.formats.avro_columns import AvroColumns
from ledgerbatch.formats.bad_value import BadValue
from ledgerbatch.formats.convert import converter, dumps, show
from ledgerbatch.formats.decoders.base import DELETE, SKIP, Decoder
from ledgerbatch.formats.decoders.catalog import make_change_decoder, make_decoder
from ledgerbatch.formats.json_columns import JsonColumns
from ledgerbatch.formats.schema import COORDINATES, METADATA, Column
from ledgerbatch.source.reader import Records

# Staging-only columns: why a record is bad, and its raw key/value as bytea hex text (bad records only).
ERROR_COLUMNS = ("_error", "_key", "_value")
# Staging-only column of pipelines whose records are changes (spec.changes): what the record does to the
# target, decoders.UPSERT | DELETE | SKIP; a DELETE row carries only the key columns, a SKIP row none.
CHANGE = "_change"

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


def staged_struct(columns: tuple[Column, ...], metadata: tuple[str, ...] = (), changes: bool = False) -> StructType:
    """The parsed rows: the schema's columns, the metadata columns, the coordinates, and why a record is
    bad with its raw key and value (`_key` doubles as the metadata column when the spec asks for it)."""
    stored = columns + tuple(METADATA[m] for m in metadata if m != "key")
    fields = [StructField(c.name, StringType() if c.staged_as_text else _SPARK_TYPES[c.type](c), True)
              for c in stored + COORDINATES]
    fields += [StructField(n, StringType(), True) for n in ((CHANGE,) if changes else ()) + ERROR_COLUMNS]
    return StructType(fields)


def parse_value(raw: bytes | None, decoder: Decoder, columns: tuple[Column, ...], converters: list[Callable]) -> tuple:
    """The typed values of one record (missing or null fields are NULL). Raises BadValue."""
    return typed_values(decoder.decode(raw), columns, converters)


def typed_values(obj, columns: tuple[Column, ...], converters: list[Callable]) -> tuple:
    """The typed values of one decoded record, naming the field that does not convert. Raises BadValue."""
    out = []
    for col, convert in zip(columns, converters):
        v = obj.get(col.name)
        if v is None:
            out.append(None)
            continue
        try:
            out.append(convert(v))
        except BadValue as exc:
            raise BadValue(f"field {col.name}{''.join(exc.path)}: {exc}") from None
        except (ValueError, OverflowError, ArithmeticError) as exc:  # out of range for the type
            raise BadValue(f"field {col.name}: {show(v)} does not convert to {col.spark_ddl} ({type(exc).__name__})") from None
        except RecursionError:  # a value a decoder built deeper than any converter's own limit
            raise BadValue(f"field {col.name}: nested too deeply") from None
    return tuple(out)


def _hex(raw: bytes | None) -> str | None:
    return None if raw is None else "\\x" + raw.hex()


def headers_json(headers: list | None) -> str:
    """`_headers`: [{"key": k, "value": text}], or "value_base64" where the value is not UTF-8 text."""
    out = []
    for key, value in headers or ():
        if value is None:
            out.append({"key": key, "value": None})
            continue
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        out.append({"key": key, "value": text} if text is not None and "\x00" not in text
                   else {"key": key, "value_base64": base64.b64encode(value).decode()})
    return dumps(out)


class Parser:
    """Raw records of one partition -> one Arrow batch of staged rows (typed, or with `_error` and the
    raw bytes as bytea hex text), with the Kafka metadata the spec asks for."""

    def __init__(self, columns: tuple[Column, ...], required: tuple[str, ...] = (), decoder: Decoder | None = None,
                 metadata: tuple[str, ...] = (), changes: bool = False):
        from pyspark.sql.pandas.types import to_arrow_schema

        self.columns = columns
        self.metadata = metadata
        self.decoder = decoder or make_decoder("json")
        self.changes = changes  # decoder is a decoders.ChangeDecoder; rows get CHANGE
        self.schema = to_arrow_schema(staged_struct(columns, metadata, changes), timezone="UTC")
        self.converters = [converter(c) for c in columns]
        self.fields = [(c.name, convert) for c, convert in zip(columns, self.converters)]
        self.required_at = [(i, c.name) for i, c in enumerate(columns) if c.name in required]
        self.empty_row = (None,) * len(columns)
        self.required = required
        # A whole chunk at a time where the format has a way (None: record by record).
        self.chunked = JsonColumns.for_parser(self) or AvroColumns.for_parser(self)

    def _row(self, raw: bytes | None) -> list | tuple:
        return self._typed(self.decoder.decode(raw))

    def _typed(self, obj) -> list | tuple:
        """The typed values of one record: one quick pass, and typed_values to say which field is bad."""
        try:
            return [None if (v := obj.get(name)) is None else convert(v) for name, convert in self.fields]
        except (ValueError, OverflowError, ArithmeticError, RecursionError):  # BadValue included
            return typed_values(obj, self.columns, self.converters)  # raises, naming the field

    def _change(self, key: bytes | None, raw: bytes | None) -> tuple[str, list | tuple]:
        """A change record: what it does, and its typed values (a delete's key columns only)."""
        change, obj = self.decoder.decode_change(key, raw)
        if change == SKIP:
            return change, self.empty_row
        if change == DELETE:
            obj = {name: obj.get(name) for _, name in self.required_at}
        return change, self._typed(obj)

    def parse(self, topic: str, partition: int, records: Records):
        import pyarrow as pa

        keys, values = records.keys, records.values
        n = len(values)
        typed = self.chunked.arrays(values) if self.chunked else None
        bad, changes = {}, None  # bad: position -> reason
        if typed is None:
            typed, bad, changes = self._each(keys, values)
        field = self.schema.field
        if "timestamp" in self.metadata:
            typed.append(pa.array(records.timestamps, pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
                         .cast(field("_timestamp").type))
        if "headers" in self.metadata:
            typed.append(pa.array([None if at in bad else headers_json(h) for at, h in enumerate(records.headers)],
                                  pa.string()))
        all_keys = "key" in self.metadata  # the `_key` column: every key, or bad records' keys only
        if bad or all_keys:
            errors = [bad.get(at) for at in range(n)]
            row_keys = [_hex(keys[at]) if all_keys or at in bad else None for at in range(n)]
            bad_values = [_hex(values[at]) if at in bad else None for at in range(n)]
            extra = [pa.array(errors, pa.string()), pa.array(row_keys, pa.string()), pa.array(bad_values, pa.string())]
        else:
            extra = [pa.nulls(n, pa.string())] * 3
        lineage = [pa.repeat(pa.scalar(topic, pa.string()), n), pa.repeat(pa.scalar(partition, pa.int32()), n),
                   pa.array(records.offsets, pa.int64())]
        if changes is not None:
            lineage.append(pa.array(changes, pa.string()))
        return pa.RecordBatch.from_arrays(typed + lineage + extra, schema=self.schema)

    def _each(self, keys: list, values: list) -> tuple[list, dict, list | None]:
        """Record by record: the typed columns, the bad records' reasons by position, and (change
        pipelines) what each record does."""
        import pyarrow as pa

        required_at, empty_row = self.required_at, self.empty_row
        rows, bad = [], {}
        changes = [] if self.changes else None
        for at, value in enumerate(values):
            try:
                if changes is None:
                    row = self._row(value)
                else:
                    change, row = self._change(keys[at], value)
                    changes.append(change)
                for i, name in (required_at if changes is None or changes[-1] != SKIP else ()):
                    if row[i] is None:
                        raise BadValue(f"field {name}: missing or null, but it is part of the target key or version")
                rows.append(row)
            except BadValue as exc:
                rows.append(empty_row)
                bad[at] = str(exc)
                if changes is not None:
                    changes[at:] = [None]
        field = self.schema.field
        typed = [pa.array(col, field(i).type) for i, col in enumerate(zip(*rows))] if rows else \
            [pa.nulls(0, field(i).type) for i in range(len(self.columns))]
        return typed, bad, changes


def make_parser(columns: tuple[Column, ...], required: tuple[str, ...], fmt: str, options: dict | None,
                metadata: tuple[str, ...], changes: bool = False) -> "Parser":
    decoder = make_change_decoder(fmt, options) if changes else make_decoder(fmt, options)
    return Parser(columns, required, decoder, metadata, changes)

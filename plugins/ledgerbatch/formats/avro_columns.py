"""`format: avro` a chunk at a time: the values of a chunk that share one writer schema are read without
building a `Decimal`, `datetime` or `date` per value, and Arrow makes their columns.

A shortcut, never a second set of rules (as json_columns.py is for JSON): `AvroColumns.arrays` answers
only when its columns are exactly what the per-record path (decoders/avro.py, then convert.py) stages for
every record of the chunk, and None otherwise; then the per-record path parses the chunk and says why a
record is bad. Only the fields mapped to columns lose their logical type for the read (a decimal is read
as its unscaled bytes, a timestamp as its integer, a date as its day number) and their values are
checked as fastavro and convert.py would check them; every other field is read as the per-record path
reads it. tests/unit/test_avro_columns.py holds the two paths to the same answers.
"""
from __future__ import annotations

import contextlib
import gc
import io
import json

from ledgerbatch.formats.decoders.avro import AvroDecoder
from ledgerbatch.formats.convert import MAX_DAY, MAX_US, MIN_DAY, MIN_US
from ledgerbatch.formats.schema import Column

_INT_BOUNDS = {"SMALLINT": 1 << 15, "INT": 1 << 31, "BIGINT": 1 << 63}
# (Avro type, logical type) -> the column types whose staged values it gives, read plainly.
_PAIRS = {("string", None): {"STRING"}, ("int", None): {"SMALLINT", "INT", "BIGINT"}, ("long", None): {"BIGINT"},
          ("boolean", None): {"BOOLEAN"}, ("double", None): {"DOUBLE"}, ("float", None): {"DOUBLE"},
          ("bytes", "decimal"): {"DECIMAL"}, ("fixed", "decimal"): {"DECIMAL"}, ("int", "date"): {"DATE"},
          ("long", "timestamp-micros"): {"TIMESTAMP"}, ("long", "timestamp-millis"): {"TIMESTAMP"}}


class AvroColumns:
    """The staged columns of a chunk of Avro values, or None where only the per-record path can tell."""

    @classmethod
    def for_parser(cls, parser):
        """The shortcut for a parse.Parser, or None: plain Avro records (not changes) into flat scalar columns."""
        columns = parser.columns
        if parser.changes or type(parser.decoder) is not AvroDecoder or not columns or \
                not all(c.is_scalar for c in columns):
            return None
        return cls(columns, parser.required, parser.decoder, parser.schema.types[:len(columns)])

    def __init__(self, columns: tuple[Column, ...], required: tuple[str, ...], decoder: AvroDecoder, types: list):
        self.columns = columns
        self.types = types  # each column's staged Arrow type
        self.required = set(required)
        self.writers = decoder.writers
        self.plans: dict[int, _Plan | None] = {}  # writer schema id -> how its records are read; None: one by one

    def arrays(self, values: list) -> list | None:
        """The staged arrays of `values` (one per column, in order), or None."""
        import pyarrow as pa
        from fastavro import schemaless_reader

        ids = {None if v is None or len(v) < 5 or v[0] != 0 else v[1:5] for v in values}
        if len(ids) != 1 or None in ids:  # a value not in the wire format, or several writer schemas
            return None
        sid = int.from_bytes(ids.pop(), "big")
        if sid not in self.plans:
            self.plans[sid] = _Plan.make(self.columns, self.required, self.writers, sid)
        plan = self.plans[sid]
        if plan is None:
            return None
        try:
            with _no_gc():
                records = [schemaless_reader(io.BytesIO(v[5:]), plan.schema, None) for v in values]
                fields = iter(zip(*map(plan.fields, records)) if plan.fields else ())  # the mapped fields' values
        except Exception:  # a value that does not decode: the per-record path gives the reason
            return None
        out = []
        for kind, read in zip(self.types, plan.reads):
            array = pa.nulls(len(values), kind) if read is None else read.array(next(fields), kind, pa)
            if array is None:
                return None
            out.append(array)
        return out


class _Plan:
    """How one writer schema's records are read: the schema without the mapped fields' logical types, and
    per column its field's read (None: no such field, NULL)."""

    def __init__(self, schema, reads: list):
        from operator import itemgetter

        self.schema = schema
        self.reads = reads
        names = [read.col.name for read in reads if read is not None]
        # A record's mapped fields as a tuple (itemgetter of one name gives the value itself).
        self.fields = itemgetter(*names) if len(names) > 1 else (lambda r: (r[names[0]],)) if names else None

    @classmethod
    def make(cls, columns: tuple[Column, ...], required: set, writers, sid: int) -> "_Plan | None":
        from fastavro import parse_schema

        try:
            registered = writers.registered(sid)
        except Exception:  # an unknown id or an outage: the per-record path tells which
            return None
        record = json.loads(registered.schema_str)
        if registered.references or not isinstance(record, dict) or record.get("type") != "record":
            return None
        fields = {f.get("name"): f for f in record.get("fields", ())}
        reads = []
        for col in columns:
            field = fields.get(col.name)
            read = None if field is None else _Read.of(field, col, col.name in required)
            if read is None and (field is not None or col.name in required):
                return None
            reads.append(read)
        try:
            return cls(parse_schema(record), reads)
        except Exception:  # fastavro refuses the schema: the per-record path reports it
            return None


class _Read:
    """One column's values from its field's plainly read values: checked, then one Arrow array."""

    def __init__(self, col: Column, logical: str | None, precision: int, required: bool):
        self.col, self.logical, self.precision, self.required = col, logical, precision, required

    @classmethod
    def of(cls, field: dict, col: Column, required: bool) -> "_Read | None":
        """The read of `field` into `col`, taking the field's logical type off (in place), or None."""
        avro_type = field["type"]
        branches = [b for b in avro_type if b != "null"] if isinstance(avro_type, list) else [avro_type]
        if len(branches) != 1:
            return None
        kind = branches[0]
        base, logical = (kind.get("type"), kind.get("logicalType")) if isinstance(kind, dict) else (kind, None)
        if col.type not in _PAIRS.get((base, logical), ()):
            return None
        if logical == "decimal" and kind.get("scale", 0) != col.scale:
            return None
        if logical is not None:
            plain = {k: v for k, v in kind.items() if k != "logicalType"}
            field["type"] = [plain if b is kind else b for b in avro_type] if isinstance(avro_type, list) else plain
        return cls(col, logical, kind.get("precision", 0) if logical == "decimal" else 0, required)

    def array(self, values: tuple, kind, pa):
        """The staged array (of type `kind`), or None where convert.py (or fastavro's logical type) would refuse
        a value."""
        import pyarrow.compute as pc

        col = self.col
        if self.required and None in values:
            return None
        try:
            if self.logical == "decimal":
                return self._decimals(values, kind, pa, pc)
            if col.type == "STRING":
                array = pa.array(values, pa.string())
                return None if pc.any(pc.match_substring(array, "\x00")).as_py() else array
            if col.type in _INT_BOUNDS:
                bound = _INT_BOUNDS[col.type]
                return pa.array(values, pa.int64()).cast(kind) if _within(
                    values, -bound, bound - 1) else None
            if col.type == "TIMESTAMP":
                micros = values if self.logical == "timestamp-micros" else [v if v is None else v * 1000 for v in values]
                return pa.array(micros, pa.int64()).cast(kind) if _within(
                    micros, MIN_US, MAX_US) else None
            if col.type == "DATE":
                return pa.array(values, pa.int32()).cast(kind) if _within(values, MIN_DAY, MAX_DAY) else None
            return pa.array(values, kind)
        except (pa.ArrowException, UnicodeError, OverflowError):  # e.g. a lone surrogate: not text
            return None

    def _decimals(self, values: list, kind, pa, pc):
        """Unscaled integers as decimal128: fastavro rounds one past the writer's precision, convert.py
        refuses one past the column's, so either sends the chunk the long way."""
        unscaled = [0 if v is None else int.from_bytes(v, "big", signed=True) for v in values]
        bound = 10 ** min(self.precision, self.col.precision)
        if not _within(unscaled, -bound + 1, bound - 1):
            return None
        data = b"".join(u.to_bytes(16, "little", signed=True) for u in unscaled)
        array = pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(data)])
        if None in values:
            array = pc.if_else(pa.array([v is None for v in values]), pa.scalar(None, kind), array)
        return array


@contextlib.contextmanager
def _no_gc():
    """The cyclic garbage collector off while a chunk's records are made: they hold no cycles, and the
    collections their many new objects set off would pass over the worker's whole heap again and again."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _within(numbers: list, low: int, high: int) -> bool:
    present = [n for n in numbers if n is not None]
    return not present or min(present) >= low and max(present) <= high

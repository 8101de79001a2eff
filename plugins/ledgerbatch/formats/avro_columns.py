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

from ledgerbatch.formats.avro_vectors import VectorPlan
from ledgerbatch.formats.decoders.avro import AvroDecoder, recursive, unbounded_items
from ledgerbatch.formats.convert import INT_BOUNDS, MAX_DAY, MAX_US, MIN_DAY, MIN_US
from ledgerbatch.formats.schema import Column

# Inclusive bounds of whole-chunk values (avro_vectors.py) by logical type or column type: a millisecond
# timestamp is bounded before it is made microseconds.
_VECTOR_BOUNDS = {**{t: (-b, b - 1) for t, b in INT_BOUNDS.items()}, "timestamp-micros": (MIN_US, MAX_US),
                  "timestamp-millis": (-(-MIN_US // 1000), MAX_US // 1000), "date": (MIN_DAY, MAX_DAY)}
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

        framed = _framed(values)
        if framed is None:  # a value not in the wire format, or several writer schemas
            return None
        sid = int.from_bytes(values[0][1:5], "big")
        if sid not in self.plans:
            self.plans[sid] = _Plan.make(self.columns, self.required, self.writers, sid)
        plan = self.plans[sid]
        if plan is None:
            return None
        if plan.vectors is not None:
            arrays = self._from_vectors(plan, framed, pa)
            if arrays is not None:
                return arrays
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


    def _from_vectors(self, plan: "_Plan", framed: tuple, pa) -> list | None:
        """The staged arrays from avro_vectors.py's read of the whole chunk, or None."""
        decoded = plan.vectors.read(*framed)
        if decoded is None:
            return None
        out = []
        for kind, read, got in zip(self.types, plan.reads, decoded):
            array = pa.nulls(len(framed[1]), kind) if read is None else read.from_vectors(*got, kind)
            if array is None:
                return None
            out.append(array)
        return out


class _Plan:
    """How one writer schema's records are read: the schema without the mapped fields' logical types, and
    per column its field's read (None: no such field, NULL); `vectors` reads whole chunks where it can."""

    def __init__(self, schema, reads: list, vectors: VectorPlan | None):
        from operator import itemgetter

        self.schema = schema
        self.reads = reads
        self.vectors = vectors
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
        vectors = VectorPlan.make(record, [c.name for c in columns])  # before _Read.of takes logical types off
        fields = {f.get("name"): f for f in record.get("fields", ())}
        reads = []
        for col in columns:
            field = fields.get(col.name)
            read = None if field is None else _Read.of(field, col, col.name in required)
            if read is None and (field is not None or col.name in required):
                return None
            reads.append(read)
        try:
            parsed = parse_schema(record)
        except Exception:  # fastavro refuses the schema: the per-record path reports it
            return None
        # values that could claim unbounded items, or nest without bound, are for the per-record path (WriterSchemas)
        return None if unbounded_items(parsed) or recursive(parsed) else cls(parsed, reads, vectors)


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
            if col.type in INT_BOUNDS:
                bound = INT_BOUNDS[col.type]
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

    def from_vectors(self, values, present, kind):
        """The staged array from a whole chunk's decoded values (avro_vectors.py), by the same rules as
        `array`, or None."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        col, missing = self.col, ~present
        if self.required and missing.any():
            return None
        if self.logical == "decimal":
            return self._vector_decimals(*values, present, kind)
        if col.type == "STRING":
            return None if pc.any(pc.match_substring(values, "\x00")).as_py() else values
        if col.type in INT_BOUNDS or col.type in ("TIMESTAMP", "DATE"):
            low, high = _VECTOR_BOUNDS[self.logical or col.type]
            given = values[present]
            if given.size and (given.min() < low or given.max() > high):
                return None
            if self.logical == "timestamp-millis":
                values = values * 1000
            if col.type == "DATE":
                return pa.array(values.astype(np.int32), pa.int32(), mask=missing).cast(kind)
            return pa.array(values, pa.int64(), mask=missing).cast(kind)
        return pa.array(values, kind, mask=missing)

    def _vector_decimals(self, joined, offsets, present, kind):
        """Big-endian two's-complement unscaled values of up to 8 bytes as decimal128 (wider: None, fastavro's
        way), within the precision as `_decimals` checks it."""
        import numpy as np
        import pyarrow as pa

        sizes = np.diff(offsets)
        if sizes.size and sizes.max() > 8:
            return None
        n, at = len(sizes), np.arange(8)
        padded = np.concatenate([joined, np.zeros(8, np.uint8)])  # every index below falls inside
        inside = at >= 8 - sizes[:, None]  # each value's bytes, right-aligned in 8
        window = padded[np.maximum(offsets[:-1, None] + sizes[:, None] - 8 + at, 0)]
        negative = (sizes > 0) & (padded[offsets[:-1]] >= 0x80)
        window = np.where(inside, window, np.where(negative[:, None], 0xFF, 0)).astype(np.uint8)
        unscaled = np.ascontiguousarray(window).view(">i8").ravel().astype(np.int64)
        bound = 10 ** min(self.precision, self.col.precision)
        if bound <= 1 << 63:
            given = unscaled[present]
            if given.size and (given.min() < 1 - bound or given.max() > bound - 1):
                return None
        pairs = np.empty((n, 2), np.int64)
        pairs[:, 0], pairs[:, 1] = unscaled, unscaled >> 63
        validity = pa.py_buffer(np.packbits(present, bitorder="little"))
        return pa.Array.from_buffers(kind, n, [validity, pa.py_buffer(pairs)])

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


def _framed(values: list) -> tuple | None:
    """(the values' bytes joined, each one's end) if every value is framed with one writer schema id, else None."""
    import numpy as np

    if None in values:
        return None
    lengths = np.fromiter(map(len, values), np.int64, len(values))
    if not lengths.size or lengths.min() < 5:
        return None
    data = np.frombuffer(b"".join(values) + bytes(16), np.uint8)  # padding: a varint's 10 bytes always fit
    ends = np.cumsum(lengths)
    heads = data[(ends - lengths)[:, None] + np.arange(5)]
    return (data, ends) if heads[0, 0] == 0 and (heads == heads[0]).all() else None


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

"""COPY data in PostgreSQL's binary format, made from Arrow arrays a column at a time: the server then
parses no text (its numeric and timestamptz input are most of a text COPY's server time). Only staging
tables whose every column has an encoder here are staged this way (model/shape.py: BatchShape.binary_types,
by formats/schema.py's binary_encodable); the others take CSV.

A row is a 16-bit field count, then per field a 32-bit length (-1: NULL) and the value in the type's
send format (big-endian). Each column becomes Arrow binary arrays whose pieces make its fields (a text
column's lengths and its bytes), one Arrow join puts every row's pieces together, and the rows' bytes
are the joined array's data buffer."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ledgerbatch.formats.schema import MAX_BINARY_DECIMAL

HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature, flags, header extension length
TRAILER = b"\xff\xff"
_NULL = b"\xff\xff\xff\xff"
_PG_EPOCH_DAYS = 10_957  # 2000-01-01, PostgreSQL's epoch, in days since 1970-01-01
_PG_EPOCH_US = _PG_EPOCH_DAYS * 86_400 * 1_000_000
_NUMERIC_NEG = 0x4000


def binary_rows(arrays: list, pg_types: tuple[str, ...]) -> bytes:
    """The binary COPY rows of `arrays` (one per column of `pg_types`, all of one length)."""
    n = len(arrays[0])
    count = _fixed_bytes(np.full(n, len(arrays), dtype=">i2").view(np.uint8).reshape(n, 2))
    pieces = [piece for a, t in zip(arrays, pg_types) for piece in _encoder(t)(a)]
    rows = pc.binary_join_element_wise(count, *pieces, pa.scalar(b"", pa.binary()))
    offsets = np.frombuffer(rows.buffers()[1], dtype=np.int32)[rows.offset:rows.offset + n + 1]
    return rows.buffers()[2][int(offsets[0]):int(offsets[-1])].to_pybytes()


def _encoder(pg_type: str) -> Callable:
    """Only for the types formats/schema.py's binary_encodable admits (BatchShape.binary_types)."""
    return _numeric if pg_type.startswith("numeric(") else _ENCODERS[pg_type]


def _fixed(values, width: int):
    """Fields of a fixed-width type: each a 32-bit `width`, then the value (numpy, big-endian)."""
    n = len(values)
    out = np.empty((n, 4 + width), dtype=np.uint8)
    out[:, :4] = np.array([width], dtype=">i4").view(np.uint8)
    out[:, 4:] = np.ascontiguousarray(values).view(np.uint8).reshape(n, width)
    return _fixed_bytes(out)


def _fixed_bytes(matrix):
    """An Arrow binary array of the rows of a (n, width) uint8 matrix."""
    n, width = matrix.shape
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, pa.py_buffer(matrix)]).cast(pa.binary())


def _with_nulls(fields, array) -> list:
    """The pieces of fixed-width `fields`: the NULL field where `array` is null."""
    if not array.null_count:
        return [fields]
    return [pc.if_else(pc.is_valid(array), fields, pa.scalar(_NULL, pa.binary()))]


def _numbers(arrow_type: pa.DataType, dtype: str) -> Callable:
    """The column's own Arrow type (a query's output has its Spark type's): Arrow's checked cast raises
    where a value does not fit the column, where numpy's astype would wrap it around."""
    def encode(array):
        values = array.cast(arrow_type).fill_null(0).to_numpy(zero_copy_only=False).astype(dtype)
        return _with_nulls(_fixed(values, np.dtype(dtype).itemsize), array)
    return encode


def _bool(array):
    values = array.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint8)
    return _with_nulls(_fixed(values, 1), array)


def _date(array):
    days = array.cast(pa.int32()).fill_null(0).to_numpy(zero_copy_only=False)
    return _with_nulls(_fixed((days - _PG_EPOCH_DAYS).astype(">i4"), 4), array)


def _timestamptz(array):
    """Microseconds since 2000-01-01 UTC: Arrow's instant, whatever zone its type names."""
    micros = array.cast(pa.timestamp("us", array.type.tz)).cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
    return _with_nulls(_fixed((micros - _PG_EPOCH_US).astype(">i8"), 8), array)


def _text(array) -> list:
    """Two pieces: the lengths (-1 where NULL), then the bytes (none where NULL)."""
    data = array.cast(pa.binary())
    lengths = pc.binary_length(data).fill_null(-1).to_numpy(zero_copy_only=False).astype(">i4")
    return [_fixed_bytes(lengths.view(np.uint8).reshape(len(lengths), 4)), data.fill_null(b"")]


def _jsonb(array) -> list:
    """jsonb's send format: version 1, then the JSON text."""
    versioned = pc.binary_join_element_wise(pa.scalar(b"\x01", pa.binary()), array.cast(pa.binary()),
                                            pa.scalar(b"", pa.binary()))  # NULL stays NULL
    return _text(versioned)


def _numeric(array):
    """numeric's send format: digit count, weight, sign, display scale, then base-10000 digits, most
    significant first. The integer part gets as many digits as the type's precision can need and the
    fraction is padded to whole digits; the server strips zero digits (make_result), so every value of
    a column is sent at one width."""
    precision, scale = array.type.precision, array.type.scale
    if precision > MAX_BINARY_DECIMAL[0] or scale > MAX_BINARY_DECIMAL[1]:  # staged as declared: never
        raise ValueError(f"binary COPY: {array.type} is past the int64 encoding of {MAX_BINARY_DECIMAL[0]} digits")
    int_digits, frac_digits = -(-(precision - scale) // 4), -(-scale // 4)
    unscaled = _unscaled(array)
    integer, fraction = np.divmod(np.abs(unscaled), 10 ** scale)
    fraction *= 10 ** (4 * frac_digits - scale)
    digits = [(integer // 10_000 ** k) % 10_000 for k in range(int_digits - 1, -1, -1)]
    digits += [(fraction // 10_000 ** k) % 10_000 for k in range(frac_digits - 1, -1, -1)]
    n, ndigits = len(unscaled), len(digits)
    head = np.empty((n, 4), dtype=">i2")
    head[:, 0] = ndigits
    head[:, 1] = int_digits - 1  # the weight of the first digit: 10000^(int_digits - 1)
    head[:, 2] = np.where(unscaled < 0, _NUMERIC_NEG, 0)
    head[:, 3] = scale
    body = np.stack(digits, axis=1).astype(">i2")
    values = np.concatenate([head.view(np.uint8).reshape(n, 8), body.view(np.uint8).reshape(n, 2 * ndigits)], axis=1)
    return _with_nulls(_fixed(values, 8 + 2 * ndigits), array)


def _unscaled(array):
    """A decimal128 array's unscaled values as int64 (precision <= 18: the low word, two's complement)."""
    words = np.frombuffer(array.buffers()[1], dtype="<i8")
    return words[2 * array.offset: 2 * (array.offset + len(array)): 2].copy()


_ENCODERS = {  # numeric(p,s) apart: whether it has one depends on p and s
    "smallint": _numbers(pa.int16(), ">i2"), "integer": _numbers(pa.int32(), ">i4"),
    "bigint": _numbers(pa.int64(), ">i8"), "real": _numbers(pa.float32(), ">f4"),
    "double precision": _numbers(pa.float64(), ">f8"),
    "boolean": _bool, "date": _date, "timestamptz": _timestamptz, "text": _text, "jsonb": _jsonb,
}

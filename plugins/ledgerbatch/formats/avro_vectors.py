"""Avro records of one writer schema read field by field across a whole chunk at once (numpy), for
avro_columns.py: no Python object per value at all.

Every value's start is known (Kafka gives each value its own bytes), so the reader keeps one position
per value and decodes the first field of all values, then the second, and so on: varints, lengths,
fixed widths and union branches are array operations. It answers only for flat records of primitive
fields (unions with null included) whose every value decodes to exactly its own last byte, and whose
mapped values pass the same checks as avro_columns.py's; anything else (a varint past 64 bits, a
boolean byte other than 0 or 1, text that is not UTF-8, a value that ends early or late, a decimal
wider than 64 bits, a logical type on an unmapped field) returns None, and the chunk takes the slower
paths, which say why a record is bad.
"""
from __future__ import annotations

_WIDTHS = {"float": 4, "double": 8}
_PRIMITIVE = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


class VectorPlan:
    """How one writer schema's values are read: per field, its reader, and the column it fills (or None)."""

    def __init__(self, fields: list[tuple["_Field", int | None]], width: int):
        self.fields = fields
        self.width = width  # columns

    @classmethod
    def make(cls, record: dict, columns: list[str]) -> "VectorPlan | None":
        """The plan of a writer schema (its JSON, logical types as written) for columns by name, or None."""
        at = {name: i for i, name in enumerate(columns)}
        fields = []
        for f in record.get("fields", ()):
            field = _Field.of(f.get("type"))
            column = at.get(f.get("name"))
            if field is None or (column is None and field.logical is not None):
                return None  # an unmapped logical type may fail where fastavro builds its value
            fields.append((field, column))
        return cls(fields, len(columns)) if fields else None

    def read(self, data, ends) -> list | None:
        """Per column, (its values, which are present) or None where no field maps to it; None if any value does
        not read exactly. `data`: the chunk's framed values joined (and 16 bytes of padding), `ends`: where each
        ends. Values: int64, bool or float64 arrays, Arrow text, or (bytes joined, offsets)."""
        import numpy as np

        pos = np.concatenate([[0], ends[:-1]]) + 5  # after the magic byte and the schema id
        out: list = [None] * self.width
        for field, column in self.fields:
            got = field.read(data, pos, ends)
            if got is None:
                return None
            pos, decoded = got
            if column is not None:
                out[column] = decoded
        return out if np.array_equal(pos, ends) else None


class _Field:
    """One field's type: a primitive, a fixed, or a union of null and one of them; `logical` as written."""

    def __init__(self, base: str, size: int, logical: str | None, nullable: bool, null_first: bool):
        self.base, self.size, self.logical, self.nullable, self.null_first = base, size, logical, nullable, null_first

    @classmethod
    def of(cls, avro_type) -> "_Field | None":
        nullable = null_first = False
        if isinstance(avro_type, list):
            if len(avro_type) != 2 or "null" not in avro_type or avro_type[0] == avro_type[1]:
                return None
            null_first = avro_type[0] == "null"
            avro_type, nullable = avro_type[1 if null_first else 0], True
        if isinstance(avro_type, dict):
            base, logical = avro_type.get("type"), avro_type.get("logicalType")
            size = avro_type.get("size", 0) if base == "fixed" else 0
            if base == "fixed" and isinstance(size, int) and size > 0:
                return cls(base, size, logical, nullable, null_first)
        else:
            base, logical = avro_type, None
        return cls(base, 0, logical, nullable, null_first) if base in _PRIMITIVE and base != "null" else None

    def read(self, data, pos, ends):
        """(positions after the field, (values, present)) of every value; None if one is wrong."""
        import numpy as np

        present = np.ones(len(pos), bool)
        if self.nullable:
            branch, pos, ok = _varint(data, pos)
            if not ok.all() or not np.isin(branch, (0, 1)).all():
                return None
            present = branch == (1 if self.null_first else 0)
        got = self._value(data, pos, present, ends)
        if got is None:
            return None
        after, values = got
        return np.where(present, after, pos), (values, present)

    def _value(self, data, pos, present, ends):
        import numpy as np

        if self.base in ("int", "long"):
            values, after, ok = _varint(data, pos)
            return (after, values) if ok[present].all() else None
        if self.base == "boolean":
            byte = data[np.minimum(pos, len(data) - 1)]
            return (pos + 1, byte == 1) if (byte[present] <= 1).all() else None
        if self.base in _WIDTHS:
            width = _WIDTHS[self.base]
            window = data[np.minimum(pos[:, None] + np.arange(width), len(data) - 1)]
            kind = np.float32 if width == 4 else np.float64
            return pos + width, np.ascontiguousarray(window).view(f"<{kind().dtype.char}").ravel().astype(np.float64)
        if self.base == "fixed":
            return _span(data, pos, np.where(present, self.size, 0), present, ends)
        size, start, ok = _varint(data, pos)
        if not ok[present].all() or (size[present] < 0).any():
            return None
        got = _span(data, start, np.where(present, size, 0), present, ends)
        if got is None or self.base == "bytes":
            return got
        return _text(*got, present)


def _span(data, start, size, present, ends):
    """Bytes of each present value: (positions after, (all of them joined, each one's offsets into that))."""
    import numpy as np

    after = start + size
    if (after > ends)[present].any():
        return None
    offsets = np.zeros(len(size) + 1, np.int64)
    np.cumsum(size, out=offsets[1:])
    index = np.repeat(start - offsets[:-1], size) + np.arange(offsets[-1])
    return after, (data[index], offsets)


def _text(after, joined, present):
    """Strings as Arrow text, or None where one is not UTF-8 (fastavro would fail that value, mapped or not)."""
    import numpy as np
    import pyarrow as pa

    data, offsets = joined
    validity = pa.py_buffer(np.packbits(present, bitorder="little"))
    text = pa.StringArray.from_buffers(len(present), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data),
                                       validity)
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return after, text


def _varint(data, pos):
    """Zigzag varints at `pos`: (values as int64, positions after, ok); not ok past 10 bytes or 64 bits."""
    import numpy as np

    window = data[np.minimum(pos[:, None] + np.arange(10), len(data) - 1)]
    more = window >= 0x80
    count = np.argmin(more, axis=1) + 1  # the first byte without the continuation bit ends the varint
    ok = ~more[np.arange(len(pos)), count - 1] & ((count < 10) | (window[:, 9] <= 1))
    shifts = np.arange(10, dtype=np.uint64) * np.uint64(7)
    parts = np.where(np.arange(10) < count[:, None], (window & 0x7F).astype(np.uint64) << shifts, np.uint64(0))
    raw = parts.sum(axis=1, dtype=np.uint64)
    values = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)
    return values, pos + count, ok

"""`format: json` a chunk at a time: Arrow's JSON reader parses a whole chunk of values straight into the
staged columns, for specs whose columns are all flat scalars.

A shortcut, never a second set of rules: `JsonColumns.arrays` answers only when its columns are exactly
what the per-record path (decoders/json.py, then convert.py) stages for every record of the chunk, and
None otherwise (then the per-record path parses the chunk and says why a record is bad). Arrow's reader
is looser than Python's json in places (NaN and Inf, exponents past Decimal's, ignored fields that are too deep or too long for Python, a
byte-order mark, blank lines) and stricter in others (a number in a STRING column, a decimal with more
places than the column): the checks before and after the read send every such chunk the long way.
tests/unit/test_json_columns.py holds the two paths to the same answers.
"""
from __future__ import annotations

import io
import re
from decimal import Decimal

from ledgerbatch.formats.convert import MAX_DAY, MAX_US, MIN_DAY, MIN_US
from ledgerbatch.formats.decoders.json import JsonDecoder
from ledgerbatch.formats.schema import Column

# The Arrow whose JSON reader the tests hold to the per-record path (requirements.txt); another parses record by record.
_ARROW = "26"
_INTS = {"SMALLINT": "int16", "INT": "int32", "BIGINT": "int64"}
_FLOAT_MAX = 3.4028234663852886e38  # what convert.py lets into a FLOAT
# Python's json refuses what Arrow's reader takes: nesting past the recursion limit, an integer literal
# past sys.get_int_max_str_digits() (4300). Values long enough to hold either are checked one by one.
_DEEP, _LONG_INT = 400, 4300
# Values Arrow reads and json here refuses: NaN, Inf, Infinity (and negated), and numbers whose exponent
# is past Decimal's (1e-40056105555952976624); an RE2 pattern over each value, wherever it is.
_SUSPECT = r"[:,\[]\s*-?(?:NaN|Inf)|[eE][+-]?0*[0-9]{18}"
_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % (_LONG_INT + 1))


class JsonColumns:
    """The staged columns of a chunk of JSON values, or None where only the per-record path can tell."""

    @classmethod
    def for_parser(cls, parser):
        """The shortcut for a parse.Parser, or None: plain JSON records (not changes) into flat scalar columns."""
        import pyarrow as pa

        columns = parser.columns
        if parser.changes or type(parser.decoder) is not JsonDecoder or not columns or pa.__version__.split(".")[0] != _ARROW:
            return None
        if any(c.type not in _INTS and c.type not in ("STRING", "BOOLEAN", "DOUBLE", "FLOAT", "DECIMAL",
                                                      "TIMESTAMP", "DATE") for c in columns):
            return None
        return cls(columns, parser.required)

    def __init__(self, columns: tuple[Column, ...], required: tuple[str, ...]):
        import pyarrow as pa
        import pyarrow.json as pj

        self.columns = columns
        self.required = [i for i, c in enumerate(columns) if c.name in required]
        read = [pa.field(c.name, _read_type(c)) for c in columns]
        self.parse_options = pj.ParseOptions(explicit_schema=pa.schema(read), unexpected_field_behavior="ignore",
                                             newlines_in_values=False)

    def arrays(self, values: list) -> list | None:
        """The staged arrays of `values` (one per column, in order), or None."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pj

        blob = _plain(values)
        if blob is None:
            return None
        try:
            table = pj.read_json(io.BytesIO(blob), read_options=pj.ReadOptions(use_threads=False, block_size=len(blob) + 1),
                                 parse_options=self.parse_options)
        except pa.ArrowException:  # a bad record, or one Arrow reads another way
            return None
        if table.num_rows != len(values):
            return None
        out = []
        for i, col in enumerate(self.columns):
            array = table.column(i).combine_chunks()
            if i in self.required and array.null_count:
                return None
            array = _staged(col, array, pa, pc)
            if array is None:
                return None
            out.append(array)
        return out


def _plain(values: list) -> bytes | None:
    """The values as lines, if every value is one UTF-8 JSON object on one line that Python's json reads
    as Arrow's does; else None."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not values:
        return None
    raw = pa.array(values, pa.binary())
    # Starting with "{" (no whitespace, no byte-order mark) every line holds at least one document,
    # so a row count equal to the values' means one each.
    if raw.null_count or not pc.all(pc.starts_with(raw, b"{")).as_py():
        return None
    text = b"\n".join(values)
    if text.count(b"\n") != len(values) - 1 or b"\r" in text:
        return None
    if pc.any(pc.match_substring_regex(raw, _SUSPECT)).as_py():
        return None
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return None
    longest = pc.max(pc.binary_length(raw)).as_py()
    if longest >= _DEEP:
        for v in values:
            if len(v) >= _DEEP and (v.count(b"{") + v.count(b"[") >= _DEEP or
                                    len(v) > _LONG_INT and _LONG_DIGITS.search(v)):
                return None
    return text


def _read_type(col: Column):
    import pyarrow as pa

    if col.type in _INTS:
        return getattr(pa, _INTS[col.type])()
    return {
        "STRING": pa.string, "BOOLEAN": pa.bool_, "DOUBLE": pa.float64,
        "FLOAT": pa.float64,  # read as convert.py does (a double), range-checked, then narrowed
        # Arrow checks a number's digits against the type's precision, but not the digits it gains when
        # scaled up: "1e30" read into decimal128(38, 10) wraps around. 76 - scale digits scale up within
        # a decimal256, and staging narrows to decimal128(p, s) once the range is checked.
        "DECIMAL": lambda: pa.decimal256(76 - col.scale, col.scale),
        "TIMESTAMP": lambda: pa.timestamp("us", tz="UTC"),
        "DATE": pa.string,  # Arrow's JSON reader reads dates from numbers only: cast after
    }[col.type]()


def _staged(col: Column, array, pa, pc):
    """A read column as staged, or None where convert.py would refuse one of its values."""
    if col.type == "STRING":
        return None if pc.any(pc.match_substring(array, "\x00")).as_py() else array
    if col.type == "DOUBLE":  # Arrow reads some numbers past a double's range as infinite (-11657660570502012e+299)
        return None if pc.any(pc.is_inf(array)).as_py() else array
    if col.type == "FLOAT":
        if pc.any(pc.greater(pc.abs(array), _FLOAT_MAX)).as_py():
            return None
        return pc.cast(array, pa.float32(), safe=False)
    if col.type == "DECIMAL":  # convert.py's range: less than 10^(p-s), after rounding to the scale
        limit = Decimal(10) ** (col.precision - col.scale)
        low, high = pc.min_max(array).values()
        if low.is_valid and (abs(low.as_py()) >= limit or abs(high.as_py()) >= limit):
            return None
        return array.cast(pa.decimal128(col.precision, col.scale))
    if col.type == "TIMESTAMP":
        return array if _within(array.cast(pa.int64()), MIN_US, MAX_US, pc) else None
    if col.type == "DATE":
        try:
            dates = pc.cast(array, pa.date32())
        except pa.ArrowInvalid:
            return None
        return dates if _within(dates.cast(pa.int32()), MIN_DAY, MAX_DAY, pc) else None
    return array


def _within(numbers, low: int, high: int, pc) -> bool:
    """Python's datetime range: Arrow also reads year 0, and offsets that cross 0001 or 9999."""
    least, most = pc.min_max(numbers).values()
    return not least.is_valid or least.as_py() >= low and most.as_py() <= high

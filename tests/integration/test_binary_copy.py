"""Binary COPY (stage/binary_copy.py) on the real PostgreSQL server: every type it encodes, at its edges and
NULL, stores exactly what the CSV COPY of the same Arrow arrays stores; which pipelines stage in binary (query
pipelines: tests/integration/test_aggregate.py)."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import psycopg2
import pyarrow as pa
import pytest

from ledgerbatch.config import libpq_dsn
from ledgerbatch.stage import binary_copy, csv_copy
from ledgerbatch.model.shape import BatchShape

pytestmark = pytest.mark.integration

UTC = dt.timezone.utc
# (PostgreSQL type, Arrow type as the parser stages it, values: edges, NULL, and a few ordinary ones)
COLUMNS = [
    ("smallint", pa.int16(), [-32768, 32767, 0, None, 7]),
    ("integer", pa.int32(), [-2**31, 2**31 - 1, 0, None, -5]),
    ("bigint", pa.int64(), [-2**63, 2**63 - 1, 0, None, 1]),
    ("real", pa.float32(), [3.4028234663852886e38, -1.401298464324817e-45, float("inf"), None, float("nan")]),
    ("double precision", pa.float64(), [1.7976931348623157e308, 5e-324, -float("inf"), None, -0.0]),
    ("boolean", pa.bool_(), [True, False, True, None, False]),
    ("date", pa.date32(), [dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1999, 12, 31), None, dt.date(2000, 1, 1)]),
    ("timestamptz", pa.timestamp("us", tz="UTC"),
     [dt.datetime(1, 1, 1, tzinfo=UTC), dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
      dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), None, dt.datetime(2000, 1, 1, tzinfo=UTC)]),
    ("numeric(18,0)", pa.decimal128(18, 0),
     [Decimal("999999999999999999"), Decimal("-999999999999999999"), Decimal(0), None, Decimal(10000)]),
    ("numeric(12,2)", pa.decimal128(12, 2),
     [Decimal("9999999999.99"), Decimal("-9999999999.99"), Decimal("-0.01"), None, Decimal("123.40")]),
    ("numeric(18,16)", pa.decimal128(18, 16),
     [Decimal("99.9999999999999999"), Decimal("-0.0000000000000001"), Decimal("0E-16"), None, Decimal("1.0001")]),
    ("numeric(5,5)", pa.decimal128(5, 5), [Decimal("0.99999"), Decimal("-0.00001"), Decimal("0.10000"), None, Decimal("0.5")]),
    ("text", pa.string(), ["", "héllo ✓ 𝄞", 'tab\tnew\nline "quoted", comma', None, "x" * 100_000]),
    ("jsonb", pa.string(), ['{"a": [1, 2.50, "x"], "b": {"c": null}}', "null", '"é"', None, "[]"]),
]


def _copy(conn, table: str, arrays: list, binary: bool) -> list:
    names = ", ".join(f"c{i}" for i in range(len(COLUMNS)))
    with conn, conn.cursor() as cur:
        cur.execute(f"CREATE TEMP TABLE {table} ({', '.join(f'c{i} {t}' for i, (t, _, _) in enumerate(COLUMNS))})")
        sql = f"COPY {table} ({names}) FROM STDIN WITH (FORMAT {'binary' if binary else 'csv'})"
        parts = [[a.slice(0, 2) for a in arrays], [a.slice(2) for a in arrays]]  # sliced arrays: offsets count
        csv_copy.copy_stream(cur, sql, parts, tuple(t for t, _, _ in COLUMNS) if binary else ())
        cur.execute(f"SELECT {', '.join(f'c{i}::text' for i in range(len(COLUMNS)))} FROM {table} ORDER BY ctid")
        return cur.fetchall()


def test_every_encoded_type_stores_what_the_csv_copy_stores(db_url):
    arrays = [pa.array(values, arrow_type) for _, arrow_type, values in COLUMNS]
    conn = psycopg2.connect(libpq_dsn(db_url))
    try:
        binary, csv = _copy(conn, "binary_rows", arrays, True), _copy(conn, "csv_rows", arrays, False)
    finally:
        conn.close()
    assert binary == csv
    columns = list(zip(*binary))
    assert columns[8] == ("999999999999999999", "-999999999999999999", "0", None, "10000")
    assert columns[9] == ("9999999999.99", "-9999999999.99", "-0.01", None, "123.40")
    assert columns[10] == ("99.9999999999999999", "-0.0000000000000001", "0.0000000000000000", None, "1.0001000000000000")
    assert columns[7][:3] == ("0001-01-01 00:00:00+00", "9999-12-31 23:59:59.999999+00", "1969-12-31 23:59:59.999999+00")
    assert columns[12][1] == "héllo ✓ 𝄞" and columns[13][0] == '{"a": [1, 2.50, "x"], "b": {"c": null}}'


def test_pipelines_stage_in_binary_where_every_column_is_encoded(make_pipeline):
    plain = make_pipeline(partitions=1)
    assert BatchShape.of_spec(plain.spec).binary_types == ("text", "text", "numeric(12,2)", "timestamptz", "text", "integer", "bigint", "bigint")
    for overrides in ({"source__schema": "order_id STRING, amount DECIMAL(38,2)"},  # past an int64
                      {"source__schema": "order_id STRING, tags ARRAY<INT>"},  # an array literal, typed by the COPY
                      {"source__metadata": ["key"]}):  # bytea, staged as hex text
        assert BatchShape.of_spec(make_pipeline(partitions=1, **overrides).spec).binary_types == (), overrides


def test_a_value_that_does_not_fit_its_column_fails_the_copy_instead_of_wrapping():
    """A query's output has its Spark types: a bigint into an integer column is checked, not truncated."""
    assert binary_copy.binary_rows([pa.array([2**31 - 1], pa.int64())], ("integer",)).endswith(b"\x7f\xff\xff\xff")
    with pytest.raises(pa.ArrowInvalid):
        binary_copy.binary_rows([pa.array([2**31], pa.int64())], ("integer",))


def test_float_specials_store_what_the_csv_copy_stores(db_url):
    """+-0, NaN and +-Infinity in real and double precision (Avro carries them; JSON has none)."""
    specials = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), None]
    arrays = [pa.array(specials, pa.float32()), pa.array(specials, pa.float64())]
    conn = psycopg2.connect(libpq_dsn(db_url))
    try:
        stored = {}
        for binary in (True, False):
            with conn, conn.cursor() as cur:
                table = f"floats_{'binary' if binary else 'csv'}"
                cur.execute(f"CREATE TEMP TABLE {table} (r real, d double precision)")
                csv_copy.copy_stream(cur, f"COPY {table} (r, d) FROM STDIN WITH (FORMAT {'binary' if binary else 'csv'})",
                                     [arrays], ("real", "double precision") if binary else ())
                cur.execute(f"SELECT r::text, d::text FROM {table} ORDER BY ctid")
                stored[binary] = cur.fetchall()
    finally:
        conn.close()
    assert stored[True] == stored[False] == [("0", "0"), ("-0", "-0"), ("NaN", "NaN"), ("Infinity", "Infinity"),
                                             ("-Infinity", "-Infinity"), (None, None)]

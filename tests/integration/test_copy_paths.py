"""The binary COPY writes exactly what the CSV COPY writes, property style: records drawn at random from the
edges of every type (numeric at the binary encoder's precision and scale limits, 18 and 16, +-0, NaN and +-Infinity, timestamps before 1970
and at the range's ends with time zones, long text, NUL bytes, non-BMP characters, nested values, NULL and
missing fields; JSON has no NaN or Infinity, so those are set aside here and their binary encoding is
checked in test_binary_copy.py) go through a range's staging (the parser, then stage/csv_copy.py: copy_range) once in each
format on the real PostgreSQL server. Both must store the same values and set aside the same records with
the same reasons. Arrays have no binary encoder: a pipeline with one stages in CSV only (BatchShape.binary_types),
so the two cannot differ there."""
from __future__ import annotations

import json
import random
from dataclasses import replace

import psycopg2
import pytest
import yaml
from sqlalchemy import text

from ledgerbatch.config import libpq_dsn
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.source.reader import Records
from ledgerbatch.spec.pipeline import load_spec
from ledgerbatch.stage import csv_copy
from ledgerbatch.stage.job import Parsing
from ledgerbatch.stage.tables import StagingTables, open_staging, staging_statements

pytestmark = pytest.mark.integration

SCHEMA = ("i INT, b BIGINT, f FLOAT, d DOUBLE, n DECIMAL(18,4), frac DECIMAL(18,16), ok BOOLEAN, day DATE, "
          "ts TIMESTAMP, s STRING, doc STRUCT<a: INT, b: ARRAY<STRING>>")
EDGES = {  # values each type takes at its edges
    "i": [-2147483648, 2147483647, 0, -0, None],
    "b": [-9223372036854775808, 9223372036854775807, 0, None],
    "f": [3.4028234663852886e38, -3.4028234663852886e38, -0.0, 0.0, 1e-45, None],
    "d": [1.7976931348623157e308, 5e-324, -0.0, -1.7976931348623157e308, None],
    "n": ["99999999999999.9999", "-99999999999999.9999", "0.00005", "-0.0000", 0, 1e-4, None],
    "frac": ["99.9999999999999999", "-0.0000000000000001", "0E-16", "-0", None],  # the encoder's scale limit
    "ok": [True, False, None],
    "day": ["0001-01-01", "9999-12-31", "1969-12-31", "1970-01-01", None],
    "ts": ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "1969-12-31T23:59:59.999999+05:30",
           "2026-03-29T02:30:00+01:00", "1900-01-01T00:00:00-08:00", "1970-01-01T00:00:00.000001Z", None],
    "s": ["", "\U0001d11e\U0001f600", "x" * 100_000, 'quote " comma , newline \n tab \t', "\\N", "NULL", "\\", None],
    "doc": [{"a": 1, "b": ["x", None]}, {"a": None, "b": []}, {}, {"b": ["\U0001f600", "é"]}, None],
}
INVALID = {  # values past them, which the parser sets aside
    "i": [2147483648, 1.5, "12"], "b": [9223372036854775808], "f": [1e39, "NaN", float("nan")],
    "d": ["-Infinity", float("inf"), float("-inf")],  # JSON has no NaN or Infinity: Python's literals are refused
    "n": ["100000000000000", "NaN", "Infinity"], "frac": [100, "1e-17"], "ok": ["yes", 0], "day": ["10000-01-01"],
    "s": ["a\u0000b"], "doc": [{"a": 2147483648}, {"a": 1, "b": ["\u0000"]}],
}


def _records(seed: int, n: int) -> list[bytes]:
    """`n` JSON objects, each field drawn from its edges or left out; about one in four with one field
    past them."""
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        obj = {f: rnd.choice(values) for f, values in EDGES.items() if rnd.random() < 0.9}
        if rnd.random() < 0.25:
            field = rnd.choice(sorted(INVALID))
            obj[field] = rnd.choice(INVALID[field])
        out.append(json.dumps(obj).encode())  # Python writes NaN and Infinity as JSON's common extension
    return out


@pytest.fixture
def spec(tmp_path):
    doc = {"name": "copy_paths", "source": {"topics": ["copy_paths"], "format": "json", "schema": SCHEMA},
           "target": {"table": "public.copy_paths", "mode": "append"}, "errors": {"policy": "quarantine", "max_ratio": 1}}
    (tmp_path / "copy_paths.yaml").write_text(yaml.safe_dump(doc))
    return load_spec(tmp_path, "copy_paths")


@pytest.mark.parametrize("seed", range(6))
def test_binary_and_csv_copies_store_the_same_values_and_set_aside_the_same_records(seed, spec, engine, db_url):
    values = _records(seed, 300)
    staged = {}
    for binary in (True, False):
        batch_id = 2_100_000_000 + seed * 2 + binary  # far past other tests' batches, whose staging shares the schema
        with engine.begin() as conn:
            table = open_staging(conn, BatchShape.of_spec(spec), batch_id, 1, libpq_dsn(db_url))
        assert table.binary_types, "every column of this schema has a binary encoder"
        if not binary:
            table = replace(table, binary_types=(), statements=staging_statements(BatchShape.of_spec(spec), table.name, False))
        parser = Parsing.of(spec).parser()
        chunks = (parser.parse("copy_paths", 0, Records(list(range(lo, lo + 50)), [None] * 50, values[lo:lo + 50]))
                  for lo in range(0, len(values), 50))
        conn = psycopg2.connect(table.dsn)
        try:
            counts = csv_copy.copy_range(chunks, table, conn)
        finally:
            conn.close()
        columns = ", ".join(f"{c}::text" for c in ("i", "b", "f", "d", "n", "frac", "ok", "day", "ts", "s", "doc"))
        with engine.begin() as c:
            good = c.execute(text(f"SELECT _offset, {columns} FROM ledger_staging.{table.name} ORDER BY _offset")).all()
            bad = c.execute(text(f"SELECT _offset, _error FROM ledger_staging.{StagingTables(table.name).bad} ORDER BY _offset")).all()
            StagingTables(table.name).drop(c)
        assert counts[2] == len(values) == len(good) + len(bad)
        staged[binary] = good, bad
    assert staged[True] == staged[False]
    good, bad = staged[True]
    assert len(good) > len(bad) > 0  # the draw reaches both: values stored and records set aside

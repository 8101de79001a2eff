"""`verify` finds each kind of violation it promises to find (the tamperings are done with plain SQL)."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from ledgerbatch.ops.run import run_pipeline
from ledgerbatch.ops.verify import verify

from .helpers import cli, order_value, produce

pytestmark = pytest.mark.integration


def test_verify_names_each_violation(engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=2, batch__max_records=10)
    produce(broker.bootstrap_servers, p.topic, [(i % 2, order_value(i) if i != 3 else b"bad") for i in range(20)])
    run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark)
    assert verify(engine, p.spec) == []
    ok = cli(["verify", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert ok.returncode == 0 and "all invariants hold" in ok.stdout

    table = f'public."{p.table}"'
    tamperings = [
        (f"DELETE FROM {table} WHERE _offset = 0 AND _partition = 0", "committed batches read 20 records"),
        (f"INSERT INTO {table} (order_id, _topic, _partition, _offset, _batch_id) VALUES ('x', '{p.topic}', 0, 999, {{batch}})",
         "outside every committed range"),
        (f"UPDATE {table} SET _batch_id = 999999 WHERE _offset = 2", "not committed batches of this pipeline"),
        (f"INSERT INTO {table} SELECT order_id, customer, amount, ts, _topic, _partition, _offset, 999999 "
         f"FROM {table} WHERE _partition = 1 AND _offset = 4", "1 coordinates appear more than once in the target"),
        ("UPDATE ledger.cursors SET next_offset = next_offset + 5 WHERE pipeline = :p AND partition = 1",
         "cursor at 15 but committed ranges end at 10"),
        ("UPDATE ledger.batch_ranges SET from_offset = from_offset + 1, records_read = least(records_read, until_offset - from_offset - 1) WHERE pipeline = :p AND partition = 0 AND from_offset = 5",
         "starts at 6 but the previous one ends at 5"),
        ("CREATE TABLE ledger_staging.b{batch}_a9 (x int)", "orphan staging table ledger_staging.b{batch}_a9"),
        ("UPDATE ledger.batch_ranges SET records_read = records_read - 1 WHERE pipeline = :p AND partition = 0 AND from_offset = 0",
         "its ranges read"),
    ]
    with engine.connect() as conn:
        batch = conn.execute(text("SELECT min(batch_id) FROM ledger.batches WHERE pipeline = :p"), {"p": p.name}).scalar_one()
    for sql, expected in tamperings:
        with engine.begin() as conn:
            conn.execute(text(sql.format(batch=batch)), {"p": p.name})
        problems = verify(engine, p.spec)
        assert any(expected.format(batch=batch) in problem for problem in problems), (expected, problems)
    failed = cli(["verify", p.name], db_url, broker.bootstrap_servers, p.dir)
    assert failed.returncode == 1 and failed.stdout.count("VIOLATION") >= len(tamperings)

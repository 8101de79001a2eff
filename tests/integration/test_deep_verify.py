"""`ledgerbatch verify --deep` (ops/deep_verify.py) against real Kafka: clean on a delivered pipeline, and
catching each tampering: a deleted target row, an amount changed by hand, a quarantined record whose raw
bytes were changed, a row with coordinates outside every range, a row rolled back to an older version;
offsets Kafka no longer holds are reported as not checkable."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from ledgerbatch.model.ranges import OffsetRange
from ledgerbatch.ops.deep_verify import deep_verify

from .helpers import cli, delete_records, order_value, produce

pytestmark = pytest.mark.integration


def test_deep_verify_finds_each_tampering_of_an_append_target(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=2, batch__max_records=100)
    records = [(i % 2, order_value(i) if i % 25 else b"{not json") for i in range(300)]
    produce(broker.bootstrap_servers, p.topic, records)

    def verify(*args: str):
        return cli(["verify", p.name, "--deep", *args], db_url, broker.bootstrap_servers, p.dir)

    assert cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir).returncode == 0
    clean = verify()
    assert clean.returncode == 0, clean.stdout + clean.stderr[-2000:]
    assert clean.stdout.splitlines()[-1] == f"{p.name}: 300 offsets in 2 ranges read again from Kafka: every record accounted for"

    table = f'public."{p.table}"'
    with engine.begin() as conn:
        conn.execute(text(f"DELETE FROM {table} WHERE _partition = 0 AND _offset = 5"))
        conn.execute(text(f"UPDATE {table} SET amount = amount + 1 WHERE _partition = 1 AND _offset = 7"))
        conn.execute(text("UPDATE ledger.quarantine SET value = 'tampered' WHERE pipeline = :p AND partition = 0 "
                          "AND \"offset\" = 0"), {"p": p.name})
        conn.execute(text(f"INSERT INTO {table} SELECT order_id, customer, amount, ts, _topic, _partition, 9999, "
                          f"_batch_id FROM {table} WHERE _partition = 1 AND _offset = 8"))
    tampered = verify()
    assert tampered.returncode == 1
    lines = tampered.stdout.splitlines()
    assert f"MISMATCH {p.name}: good records missing from the target: 1, e.g. {p.topic}[0] offset 5" in lines
    assert f"MISMATCH {p.name}: rows that differ from their record in Kafka: 1, e.g. {p.topic}[1] offset 7" in lines
    assert f"MISMATCH {p.name}: quarantined records whose bytes differ from Kafka's: 1, e.g. {p.topic}[0] offset 0" in lines
    assert any(line.startswith(f"VIOLATION {p.name}: 1 target rows lie outside every committed range") for line in lines)
    assert lines[-1] == f"{p.name}: 300 offsets in 2 ranges read again from Kafka: 3 kinds of mismatch"

    # Offsets gone from Kafka are not checkable, never passed; --since reads only later batches.
    delete_records(broker.bootstrap_servers, p.topic, 0, 50)
    with engine.connect() as conn:
        since = conn.execute(text("SELECT max(batch_id) FROM ledger.batches WHERE pipeline = :p AND kind = 'live'"),
                             {"p": p.name}).scalar_one()
    gone = verify()
    assert f"NOT CHECKABLE {p.name}: {p.topic}[0] [0, 50) (50 offsets): no longer in Kafka (retention)" in gone.stdout
    assert gone.stdout.splitlines()[-1].startswith(f"{p.name}: 250 offsets in 2 ranges read again from Kafka")
    recent = verify("--since", str(since))
    assert recent.stdout.splitlines()[-1].startswith(f"{p.name}: 100 offsets in 2 ranges read again from Kafka: ")
    with engine.connect() as conn:  # every deep read is an abandoned replay batch, never committed
        reads = conn.execute(text("SELECT count(*) FROM ledger.batches WHERE pipeline = :p AND kind = 'replay' AND "
                                  "status = 'abandoned' AND error LIKE 'verify --deep%'"), {"p": p.name}).scalar_one()
    assert reads == 4


def test_deep_verify_finds_a_row_rolled_back_to_an_older_version(engine, db_url, broker, make_pipeline):
    p = make_pipeline(partitions=1, target={"table": "", "mode": "upsert", "key": ["order_id"], "version": "ts"})
    spec_file = p.dir / f"{p.name}.yaml"
    spec_file.write_text(spec_file.read_text().replace("table: ''", f"table: public.{p.table}"))
    changes = [{"order_id": f"o-{i % 5}", "customer": "c", "amount": f"{i}.00", "ts": f"2026-11-24T10:00:{i:02d}Z"}
               for i in range(20)]
    produce(broker.bootstrap_servers, p.topic, [(0, json.dumps(c).encode()) for c in changes])
    assert cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir).returncode == 0
    verify = ["verify", p.name, "--deep"]
    assert cli(verify, db_url, broker.bootstrap_servers, p.dir).returncode == 0
    with engine.begin() as conn:  # o-0 put back to its change at offset 5 (ts :05), as a bad restore would
        conn.execute(text(f"UPDATE public.\"{p.table}\" SET amount = 5.00, ts = '2026-11-24T10:00:05Z', _offset = 5 "
                          "WHERE order_id = 'o-0'"))
    rolled_back = cli(verify, db_url, broker.bootstrap_servers, p.dir)
    assert rolled_back.returncode == 1
    # o-0's changes at offsets 10 and 15 are newer than its row's: the key is named
    assert (f"MISMATCH {p.name}: keys whose row is not their last change: the row is older: 1, e.g. key (o-0) at "
            f"{p.topic}[0] offset 5" in rolled_back.stdout.splitlines())


def test_deep_verify_recomputes_an_aggregate_targets_groups_from_kafka(engine, db_url, broker, make_pipeline):
    from .test_aggregate import AGGREGATE, produce_orders

    p = make_pipeline(partitions=2, batch__max_records=100, **AGGREGATE)
    produce_orders(broker, p, 300, seed=7)

    def ledgerbatch(*args: str):
        return cli([*args], db_url, broker.bootstrap_servers, p.dir)

    assert ledgerbatch("run", p.name).returncode == 0
    # A replay of partition 0's first offsets supersedes whole batches; its contribution stands for them.
    assert ledgerbatch("replay", p.name, "--topic", p.topic, "--partitions", "0", "--from-offset", "0",
                       "--until-offset", "10").returncode == 0
    clean = ledgerbatch("verify", p.name, "--deep")
    assert clean.returncode == 0, clean.stdout + clean.stderr[-2000:]
    assert clean.stdout.splitlines()[-1] == f"{p.name}: 300 offsets in 2 ranges read again from Kafka: every record accounted for"

    contributions = f'ledger_aggregates."{p.name}"'
    with engine.begin() as conn:
        standing = conn.execute(text(f"SELECT max(_batch_id) FROM {contributions}")).scalar_one()
        conn.execute(text(f"UPDATE {contributions} SET revenue = revenue + 1 WHERE _batch_id = :b AND customer = 'c-0' "
                          f"AND minute = '2026-11-21T10:00:00'"), {"b": standing})
        conn.execute(text(f"DELETE FROM {contributions} WHERE customer = 'c-1' AND minute = '2026-11-21T10:01:00'"))
        conn.execute(text(f"INSERT INTO {contributions} (_batch_id, customer, minute, orders, revenue, smallest, largest) "
                          f"VALUES (:b, 'c-9', '2026-11-21T10:00:00', 1, 1.00, 1.00, 1.00)"), {"b": standing})
    tampered = ledgerbatch("verify", p.name, "--deep")
    assert tampered.returncode == 1
    lines = tampered.stdout.splitlines()
    assert f'MISMATCH {p.name}: contributed groups that differ from Kafka\'s records: 1, e.g. group (c-0,"2026-11-21 10:00:00+00")' in lines
    assert f'MISMATCH {p.name}: groups of Kafka\'s records missing from the contributions: 1, e.g. group (c-1,"2026-11-21 10:01:00+00")' in lines
    assert f'MISMATCH {p.name}: contributed groups that no record in Kafka makes: 1, e.g. group (c-9,"2026-11-21 10:00:00+00")' in lines

    # A standing batch with offsets Kafka no longer holds is not checkable as a whole.
    delete_records(broker.bootstrap_servers, p.topic, 0, 5)
    gone = ledgerbatch("verify", p.name, "--deep", "--since", "1")
    assert f"NOT CHECKABLE {p.name}: {p.topic}[0] [0, " in gone.stdout


def test_offsets_retention_deletes_while_deep_verify_reads_are_not_checkable(engine, db_url, broker, make_pipeline,
                                                                              spark):
    """Retention deletes the oldest offsets after verify --deep looked at the log and before it read them: the
    read fails on them, and they are reported as not checkable, the rest read again and checked, never a
    DataLossError with its advice to acknowledge a loss."""
    p = make_pipeline(partitions=1)
    produce(broker.bootstrap_servers, p.topic, [(0, order_value(i)) for i in range(100)])
    assert cli(["run", p.name], db_url, broker.bootstrap_servers, p.dir).returncode == 0
    reads = []

    def spark_after_retention():
        if not reads:
            delete_records(broker.bootstrap_servers, p.topic, 0, 30)
        reads.append(1)
        return spark

    report = deep_verify(engine, p.spec, db_url, broker.bootstrap_servers, spark_after_retention)
    assert len(reads) == 2  # the first read met the deleted offsets; the second read what is left
    assert report.not_checkable == [OffsetRange(p.topic, 0, 0, 30)]
    assert report.ranges == [OffsetRange(p.topic, 0, 30, 100)] and report.records == 70 and report.problems == []
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ledger.batches WHERE pipeline = :p AND kind = 'replay' AND "
                                 "status = 'abandoned'"), {"p": p.name}).scalar_one() == 2

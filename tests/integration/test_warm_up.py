"""A follower's warm-up (stage/warm_up.py) runs a transform's plan over the newest records, so that its first
batch generates and compiles no code (counted by Spark's own codegen metrics) and the JVM's hot paths of the
plan have seen rows; a pipeline without a transform reads, parses and encodes them as its staging tasks do.
Nothing is written; on real Kafka and PostgreSQL."""
from __future__ import annotations

import json
import logging

import pytest
from sqlalchemy import text

from ledgerbatch.ops.run import run_pipeline
from ledgerbatch.stage.warm_up import warm_up

from .test_aggregate import expected_totals, produce_orders

pytestmark = pytest.mark.integration

# Queries no other test runs, so that Spark's code cache holds nothing of their plans yet.
PER_CUSTOMER = """
SELECT customer, count(*) AS orders, sum(amount) AS revenue, max(amount) AS largest
FROM batch WHERE amount > 0 AND {predicate} GROUP BY customer
"""
MEASURES = {"orders": "sum", "revenue": "sum", "largest": "max"}


def _pipeline(make_pipeline, predicate: str):
    return make_pipeline(partitions=3, transform=PER_CUSTOMER.format(predicate=predicate), target__mode="aggregate",
                         target__key=["customer"], target__measures=MEASURES)


def _compilations(spark) -> int:
    """Classes Spark's code generator has compiled in this JVM (local mode: the driver's and the executors')."""
    return spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount()


def _per_customer(records) -> dict:
    totals = {}
    for (customer, _), (orders, revenue, _, largest) in expected_totals(records).items():
        n, r, m = totals.get(customer, (0, 0, None))
        totals[customer] = (n + orders, r + revenue, largest if m is None else max(m, largest))
    return totals


def _batches(engine, p) -> int:
    """What the pipeline has in the ledger: the warm-up writes nothing."""
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM ledger.batches WHERE pipeline = :p"),
                            {"p": p.spec.name}).scalar()


def _staging_tables(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM pg_tables WHERE schemaname = 'ledger_staging'")).scalar()


def _target(engine, p) -> dict:
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT customer, orders, revenue, largest FROM {p.table}")).all()
    return {r.customer: (r.orders, r.revenue, r.largest) for r in rows}


def test_the_first_batch_after_the_warm_up_compiles_no_code(engine, db_url, broker, spark, make_pipeline):
    cold = _pipeline(make_pipeline, "order_id <> 'x-cold'")
    produce_orders(broker, cold, 200, seed=11)
    before = _compilations(spark)
    run_pipeline(engine, cold.spec, db_url, broker.bootstrap_servers, lambda: spark)
    assert _compilations(spark) > before  # without the warm-up the batch compiles its plan's code

    warm = _pipeline(make_pipeline, "length(customer) < 40")
    records = produce_orders(broker, warm, 300, seed=12)
    done = warm_up(spark, warm.spec, broker.bootstrap_servers)
    assert done.seconds > 0
    assert done.offsets == 300  # the plan ran over every record there is (fewer than its sample)
    assert done.rows_out == len(_per_customer(records))  # the query's groups came out, and were dropped
    assert _batches(engine, warm) == 0
    before = _compilations(spark)
    assert run_pipeline(engine, warm.spec, db_url, broker.bootstrap_servers, lambda: spark).batches == 1
    assert _compilations(spark) == before
    assert _target(engine, warm) == _per_customer(records)


def test_a_per_column_transform_is_warmed_up_too(engine, db_url, broker, spark, make_pipeline):
    cold = make_pipeline(partitions=2, transform={"customer": "concat(upper(customer), '-cold')"})
    produce_orders(broker, cold, 100, seed=13)
    before = _compilations(spark)
    run_pipeline(engine, cold.spec, db_url, broker.bootstrap_servers, lambda: spark)
    assert _compilations(spark) > before

    warm = make_pipeline(partitions=2, transform={"customer": "concat(lower(customer), '-warm')"})
    records = produce_orders(broker, warm, 100, seed=14)
    done = warm_up(spark, warm.spec, broker.bootstrap_servers)
    assert done.rows_out == done.offsets == 100  # a row per record, bad ones too
    assert _batches(engine, warm) == 0
    before = _compilations(spark)
    run_pipeline(engine, warm.spec, db_url, broker.bootstrap_servers, lambda: spark)
    assert _compilations(spark) == before
    good = [json.loads(v) for _, v in records if v.startswith(b'{"')]
    with engine.connect() as conn:
        staged = sorted(conn.execute(text(f"SELECT order_id, customer FROM {warm.table}")).all())
    assert staged == sorted((o["order_id"], o["customer"].lower() + "-warm") for o in good)


@pytest.mark.parametrize("overrides", [{}, {"source__metadata": ["key"]}], ids=["binary", "csv"])
def test_a_pipeline_without_a_transform_reads_parses_and_encodes_the_newest_records(overrides, engine, db_url, broker,
                                                                                  spark, make_pipeline):
    p = make_pipeline(partitions=3, **overrides)
    records = produce_orders(broker, p, 300, seed=15)
    staging_tables = _staging_tables(engine)
    done = warm_up(spark, p.spec, broker.bootstrap_servers)
    good = [v for _, v in records if v.startswith(b'{"')]
    assert (done.offsets, done.rows_out) == (300, len(good))  # every record read, the good ones encoded
    assert _batches(engine, p) == 0 and _staging_tables(engine) == staging_tables
    assert run_pipeline(engine, p.spec, db_url, broker.bootstrap_servers, lambda: spark).rows_written == len(good)


def test_a_plan_that_cannot_run_leaves_the_warm_up_to_its_first_batch(engine, broker, spark, make_pipeline, caplog):
    """The warm-up is only a head start: a query Spark refuses is reported by the batch, not by the warm-up."""
    p = _pipeline(make_pipeline, "no_such_column > 1")
    with caplog.at_level(logging.WARNING, logger="ledgerbatch.stage.warm_up"):
        assert warm_up(spark, p.spec, broker.bootstrap_servers).rows_out == 0
    assert "the warm-up did not finish" in caplog.text
    assert "no_such_column" in caplog.text

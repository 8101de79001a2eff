"""The batch's shape (model/shape.py) is decided once, at staging, and the commit reads the same one: for a
plain, a change, a query and an aggregate pipeline staged by local Spark from real Kafka, the shape the commit
builds from the ledger's record equals the one staging built, and the staging table and the target have
exactly its columns."""
import pytest
from sqlalchemy import text

from ledgerbatch.commit.transaction import commit_batch
from ledgerbatch.ledger.batches import get_batch
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.plan.live import plan_next
from ledgerbatch.stage.process import process_batch
from ledgerbatch.stage.tables import StagingTables
from ledgerbatch.stage.transform import batch_shape

from .test_aggregate import AGGREGATE, produce_orders

pytestmark = pytest.mark.integration

COLUMNS = "SELECT column_name FROM information_schema.columns WHERE table_schema = :s AND table_name = :t ORDER BY ordinal_position"
PIPELINES = {
    "plain": {},
    "metadata": {"source__metadata": ["timestamp"]},
    "query": {"transform": "SELECT amount, order_id, _topic, _partition, _offset, upper(customer) AS who "
                           "FROM batch WHERE amount > 0"},
    "aggregate": AGGREGATE,
}


@pytest.mark.parametrize("overrides", PIPELINES.values(), ids=PIPELINES.keys())
def test_the_shape_staged_is_the_shape_committed(overrides, engine, db_url, broker, spark, make_pipeline):
    p = make_pipeline(partitions=2, **overrides)
    produce_orders(broker, p, 60, seed=3)
    staged_shape = batch_shape(spark, p.spec)
    planned = plan_next(engine, p.spec, broker.bootstrap_servers)
    staged = process_batch(spark, engine, p.spec, planned.batch_id, db_url, broker.bootstrap_servers)
    with engine.connect() as conn:
        recorded = BatchShape.recorded(p.spec, get_batch(conn, staged.batch_id).output_schema)
        staging_columns = StagingTables(staged.staging_table).columns(conn)
    assert recorded == staged_shape
    assert tuple(staging_columns) == staged_shape.staged_names + tuple(c.name for c in staged_shape.lineage)
    assert commit_batch(engine, p.spec, staged.batch_id, staged.attempt).rows_written > 0
    with engine.connect() as conn:
        target_columns = conn.execute(text(COLUMNS), {"s": "public", "t": p.table}).scalars().all()
    assert tuple(target_columns) == staged_shape.names + tuple(c.name for c in staged_shape.lineage)

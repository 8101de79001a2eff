"""Which columns of `batch` a query's staging tasks send to Spark (transform.query_inputs), analysed by local
Spark: only what the query names where that is sure, every column where it is not."""
import pytest

from ledgerbatch.spec.pipeline import parse_spec
from ledgerbatch.stage.transform import query_inputs, run_query, view_struct

pytestmark = pytest.mark.integration
ALL = ("order_id", "customer", "amount", "ts", "_topic", "_partition", "_offset")


def spec(query: str, mode: str = "aggregate"):
    target = {"table": "public.q", "mode": mode}
    if mode == "aggregate":
        target |= {"key": ["customer"], "measures": {"n": "sum"}}
    return parse_spec({"name": "q", "target": target, "transform": query, "source": {
        "topics": ["q"], "format": "json", "schema": "order_id STRING, customer STRING, amount DECIMAL(12,2), ts TIMESTAMP"}})


@pytest.mark.parametrize("query, inputs", [
    ("SELECT customer, count(*) AS n FROM batch GROUP BY customer", ("customer",)),
    ("SELECT CAST(substr(customer, 3) AS INT) % 30 AS customer, sum(amount * 2) AS n, min(TS) AS t FROM batch "
     "GROUP BY 1", ("customer", "amount", "ts")),  # a product is no star; names match in any case
    ("SELECT 1 AS k, count(*) AS n FROM batch", ("_partition",)),  # one column carries the rows
    ("SELECT customer, count(*) AS n FROM batch WHERE `_offset` > 3 -- amount\nGROUP BY customer",
     ("customer", "amount", "_offset")),  # quoted names count; a name in a comment keeps its column (harmless)
])
def test_the_query_gets_only_the_columns_it_names(spark, query, inputs):
    assert query_inputs(spark, spec(query)) == inputs


@pytest.mark.parametrize("query, mode", [
    ("SELECT * FROM batch WHERE amount >= 500", "append"),
    ("SELECT b.*, 1 AS one FROM batch b", "append"),
    ("SELECT customer, hash(*) AS n FROM batch GROUP BY customer, hash(*)", "aggregate"),
    ("SELECT a.customer, count(*) AS n FROM batch a NATURAL JOIN batch b GROUP BY a.customer", "aggregate"),
])
def test_a_star_for_columns_or_a_natural_join_gets_every_column(spark, query, mode):
    assert query_inputs(spark, spec(query, mode)) == ALL


def test_the_pruned_view_gives_the_query_the_same_rows(spark):
    """What the staging task sends (view_struct of the inputs) is what the query reads: same result as the whole view."""
    s = spec("SELECT customer, count(*) AS n, sum(amount) AS total FROM batch WHERE _offset % 2 = 0 GROUP BY customer")
    inputs = query_inputs(spark, s)
    assert inputs == ("customer", "amount", "_offset")
    rows = [{"order_id": f"o{i}", "customer": f"c{i % 3}", "amount": None, "ts": None, "_topic": "q",
             "_partition": 0, "_offset": i} for i in range(30)]
    whole = spark.createDataFrame(rows, view_struct(s))
    pruned = spark.createDataFrame([{k: r[k] for k in inputs} for r in rows], view_struct(s, inputs))
    assert sorted(run_query(spark, pruned, s).collect()) == sorted(run_query(spark, whole, s).collect())

"""model/shape.py: a batch's shape from the spec, from a query's output and from the ledger's record of it."""
import pytest

from ledgerbatch.errors import SpecError
from ledgerbatch.formats.schema import BINARY_COPY_TYPES, parse_schema
from ledgerbatch.model.shape import BatchShape
from ledgerbatch.spec.pipeline import parse_spec

SCHEMA = "order_id STRING, customer STRING, amount DECIMAL(12,2), ts TIMESTAMP"


def spec(target: dict | None = None, transform=None, **source):
    doc = {"name": "s", "source": {"topics": ["t"], "format": "json", "schema": SCHEMA, **source},
           "target": {"table": "public.s", "mode": "append", **(target or {})}}
    if transform is not None:
        doc["transform"] = transform
    return parse_spec(doc)


def test_a_plain_pipelines_shape_is_its_schema_then_its_metadata():
    shape = BatchShape.of_spec(spec(metadata=["timestamp"]))
    assert shape.names == ("order_id", "customer", "amount", "ts", "_timestamp")
    assert shape.output_schema is None and shape.coordinates == ("_topic", "_partition", "_offset")
    assert shape.copy_types == ("text", "text", "numeric(12,2)", "timestamptz", "timestamptz", "text", "integer",
                                "bigint", "bigint")
    assert shape.binary_types == shape.copy_types
    assert BatchShape.recorded(spec(metadata=["timestamp"]), None) == shape


def test_a_change_pipeline_stages_its_change_column():
    shape = BatchShape.of_spec(spec({"mode": "upsert", "key": ["order_id"], "deletes": True}, format="debezium"))
    assert shape.staged_names[-1] == "_change" and "_change" not in shape.names
    assert shape.key == ("order_id",) and shape.changes


@pytest.mark.parametrize("target, output", [
    ({}, "amount DECIMAL(12,2), _offset BIGINT, order_id STRING, _partition INT, _topic STRING, who STRING"),
    ({"mode": "aggregate", "key": ["customer"], "measures": {"n": "sum"}}, "customer STRING, n BIGINT"),
])
def test_a_query_pipelines_shape_recorded_at_staging_is_the_one_its_commit_reads(target, output):
    s = spec(target, transform="SELECT * FROM batch")
    staged = BatchShape.of_output(s, parse_schema(output, lineage_names=True))
    assert BatchShape.recorded(s, staged.output_schema) == staged
    assert not set(staged.coordinates) & set(staged.names)
    assert staged.output_order == staged.names + staged.coordinates  # the order its COPY takes


def test_groups_carry_only_their_batch_id():
    s = spec({"mode": "aggregate", "key": ["customer"], "measures": {"n": "sum"}}, transform="SELECT * FROM batch")
    shape = BatchShape.of_output(s, parse_schema("customer STRING, n BIGINT"))
    assert shape.groups and shape.coordinates == () and [c.name for c in shape.lineage] == ["_batch_id"]
    assert shape.output_order == ("customer", "n") and shape.copy_types == ("text", "bigint", "bigint")


def test_a_query_batch_staged_without_its_output_is_refused():
    with pytest.raises(SpecError, match="staged without a query's output columns"):
        BatchShape.recorded(spec(transform="SELECT * FROM batch"), None)


@pytest.mark.parametrize("schema, binary", [
    ("a DECIMAL(18,16)", True), ("a DECIMAL(19,2)", False), ("a DECIMAL(18,17)", False),
    ("a ARRAY<INT>", False), ("a BINARY", False), ("a MAP<STRING, INT>", True),
])
def test_the_binary_copy_is_chosen_where_every_column_has_an_encoder(schema, binary):
    shape = BatchShape(parse_schema(schema))
    assert bool(shape.binary_types) is binary


def test_the_encodable_types_are_the_binary_encoders():
    from ledgerbatch.stage.binary_copy import _ENCODERS

    assert set(_ENCODERS) == BINARY_COPY_TYPES

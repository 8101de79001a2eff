import pytest

from ledgerbatch.errors import SpecError
from ledgerbatch.spec.pipeline import parse_spec

MINIMAL = {
    "name": "orders",
    "source": {"topics": ["orders"], "format": "json",
               "schema": "order_id STRING, customer STRING, amount DECIMAL(12,2), ts TIMESTAMP"},
    "target": {"table": "public.orders", "mode": "append"},
    "batch": {"max_records": 100000},
    "errors": {"policy": "quarantine", "max_ratio": 0.05},
}


def spec_with(**changes):
    doc = {k: dict(v) if isinstance(v, dict) else v for k, v in MINIMAL.items()}
    for path, value in changes.items():
        section, _, key = path.partition("__")
        if key:
            doc[section][key] = value
        else:
            doc[section] = value
    return doc


def test_design_minimal_spec_is_accepted():
    s = parse_spec(MINIMAL)
    assert (s.name, s.topics, s.target_schema, s.target_table, s.mode) == ("orders", ("orders",), "public", "orders", "append")
    assert [c.pg_type for c in s.columns] == ["text", "text", "numeric(12,2)", "timestamptz"]
    assert s.start == "earliest" and s.max_records == 100000


@pytest.mark.parametrize("changes, message", [
    ({"target__table": "x; DROP TABLE y"}, "not a valid identifier"),
    ({"target__table": "a.b.c"}, "must be `table` or `schema.table`"),
    ({"target__table": "ledger_staging.b2_archive"}, "schema 'ledger_staging' belongs to ledgerbatch"),
    ({"target__table": "ledger.orders"}, "schema 'ledger' belongs to ledgerbatch"),
    ({"source__schema": "id STRING, id INT"}, "appears twice"),
    ({"source__schema": "`x; drop` STRING"}, "not a valid identifier"),
    ({"source__schema": "id INTERVAL"}, "is not supported"),
    ({"source__schema": "id MAP<STRUCT<a: INT>, INT>"}, "MAP keys must be a scalar type"),
    ({"source__metadata": ["offset"]}, "source.metadata must be a list of distinct items from key, timestamp, headers"),
    ({"source__schema": "_offset BIGINT"}, "reserved for lineage"),
    ({"source__schema": "a DECIMAL(40,2)"}, "precision <= 38"),
    ({"source__format": "xml"}, "not supported"),
    ({"source__shema": "x"}, "unknown key(s) shema"),
    ({"extra": 1}, "unknown key(s) extra"),
    ({"target__mode": "upsert"}, "needs target.key"),
    ({"target__mode": "upsert", "target__key": ["nope"]}, "not in source.schema"),
    ({"target__key": ["order_id"]}, "only used with target.mode upsert"),
    ({"batch__max_records": 0}, "positive integer"),
    ({"batch__max_records": True}, "positive integer"),
    ({"errors__max_ratio": 2}, "between 0 and 1"),
    ({"errors__policy": "ignore"}, "must be one of quarantine, fail"),
    ({"errors__min_bad": -1}, "errors.min_bad must be a whole number of records, 0 or more, got -1"),
    ({"batch__max_records_per_partition": 0}, "batch.max_records_per_partition must be a positive integer, got 0"),
    ({"batch__max_bytes": 0}, "batch.max_bytes must be a positive number of bytes or a size such as 512KiB"),
    ({"batch__max_bytes": "64 megabytes"}, "batch.max_bytes must be a positive number of bytes or a size such as"),
    ({"batch__min_records": 200000}, "batch.min_records must be a positive integer up to batch.max_records (100000)"),
    ({"batch__min_records": 1000}, "batch.min_records needs batch.max_delay (e.g. 5m)"),
    ({"batch__min_records": 1000, "batch__max_delay": "5 minutes"}, "batch.max_delay must be seconds or a duration "
                                                                   "such as 90s, 5m, 1h or 30d, got '5 minutes'"),
    ({"source__start": {"time": "yesterday"}}, "source.start.time: 'yesterday' is not an ISO-8601 time"),
    ({"source__start": {"when": "2026-11-01"}}, "source.start must be earliest, latest or {time: ISO-8601}"),
    ({"errors__min_bad": 2.5}, "errors.min_bad must be a whole number of records, 0 or more, got 2.5"),
    ({"source__start": "middle"}, "must be one of earliest, latest"),
    ({"source__topics": []}, "non-empty list"),
    ({"source__topics": ["bad topic"]}, "not a valid Kafka topic name"),
    ({"name": "Orders-1"}, "lowercase letters"),
    ({"source__format": "debezium"}, "source.format debezium needs target.mode upsert with target.key"),
    ({"target__deletes": True}, "target.deletes needs target.mode upsert"),
    ({"target__mode": "upsert", "target__key": ["order_id"], "target__deletes": "yes"}, "true or false"),
    ({"source__format": "debezium", "target__mode": "upsert", "target__key": ["order_id"],
      "transform": "SELECT * FROM batch"}, "a query cannot see deletes"),
    ({"target__table": "ledger_deletes.orders"}, "schema 'ledger_deletes' belongs to ledgerbatch"),
    ({"source__schema_registry": {"url": "http://r"}}, "only used by the registry formats (avro, protobuf, json_schema) "
                                                       "and by debezium with converter avro"),
    ({"source__format": "debezium_avro"}, "source.format 'debezium_avro' is not supported"),
    ({"source__format": "debezium", "source__converter": "avro", "source__schema_registry": {"url": "http://r"}},
     "source.format debezium needs target.mode upsert"),
    ({"source__format": "debezium", "source__schema_registry": None, "target__mode": "upsert",
      "target__key": ["order_id"]}, "source.schema_registry must be a mapping"),
    # Refused before source.converter existed, and still: a registry with JSON Debezium.
    ({"source__format": "debezium", "source__schema_registry": {"url": "http://r"}, "target__mode": "upsert",
      "target__key": ["order_id"]}, "only used by the registry formats (avro, protobuf, json_schema) "
                                    "and by debezium with converter avro"),
    ({"source__format": "debezium", "source__converter": "protobuf", "target__mode": "upsert",
      "target__key": ["order_id"]}, "source.converter must be one of json, avro, got 'protobuf'"),
    ({"source__format": "debezium", "source__converter": None, "target__mode": "upsert",
      "target__key": ["order_id"]}, "source.converter must be one of json, avro, got None"),
    ({"source__converter": "json"}, "source.converter is only used with source.format debezium (where it is one of "
                                    "json, avro); source.format is json"),
    ({"source__format": "avro", "source__converter": "avro"},
     "source.converter is only used with source.format debezium (where it is one of json, avro); source.format is avro"),
])
def test_bad_specs_get_clear_errors(changes, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse_spec(spec_with(**changes))


def test_missing_sections_and_fields():
    with pytest.raises(SpecError, match="missing required key 'source'"):
        parse_spec({"name": "x", "target": {"table": "t"}})
    with pytest.raises(SpecError, match="missing required key 'schema'"):
        parse_spec(spec_with(source={"topics": ["a"]}))
    with pytest.raises(SpecError, match="must be a mapping"):
        parse_spec(["not", "a", "mapping"])


def test_change_pipelines():
    cdc = parse_spec(spec_with(source__format="debezium", target__mode="upsert", target__key=["order_id"]))
    deletes = parse_spec(spec_with(target__mode="upsert", target__key=["order_id"], target__deletes=True))
    plain = parse_spec(spec_with(target__mode="upsert", target__key=["order_id"]))
    assert cdc.changes and deletes.changes and not plain.changes and not parse_spec(MINIMAL).changes
    assert cdc.version != plain.version != deletes.version  # every spec text has its version


def test_debezium_converter_avro_reads_avroconverter_events():
    """`converter: avro` is Debezium through Confluent's AvroConverter: a registry format (evolve additive by
    default, `schema:` optional, the registry url from the spec or the deployment); without it, or with
    `converter: json`, JsonConverter's envelopes (evolve none, `schema:` required)."""
    cdc = {"source__format": "debezium", "target__mode": "upsert", "target__key": ["order_id"]}
    json_cdc = parse_spec(spec_with(**cdc))
    explicit_json = parse_spec(spec_with(**cdc, source__converter="json"))
    avro_cdc = parse_spec(spec_with(**cdc, source__converter="avro"))
    schemaless = parse_spec(spec_with(**cdc, source={"topics": ["orders"], "format": "debezium", "converter": "avro",
                                                     "schema_registry": {"url": "http://r", "timeout": 5}}))
    assert [(s.format, s.evolve) for s in (json_cdc, explicit_json, avro_cdc)] == [
        ("debezium", "none"), ("debezium", "none"), ("debezium_avro", "additive")]
    assert avro_cdc.changes and schemaless.columns == () and schemaless.format_options == (("timeout", "5"),
                                                                                          ("url", "http://r"))
    # The version hashes the spec's text, converter included: an Avro spec never shares a JSON one's version.
    assert len({json_cdc.version, explicit_json.version, avro_cdc.version}) == 3
    for source in ({"topics": ["orders"], "format": "debezium"},
                   {"topics": ["orders"], "format": "debezium", "converter": "json"}):
        with pytest.raises(SpecError, match="missing required key 'schema'"):
            parse_spec(spec_with(**cdc, source=source))


def test_debezium_with_an_empty_registry_is_still_json():
    """Before source.converter, `format: debezium` with `schema_registry: {}` was a valid JSON Debezium spec;
    it still is, with the same version (its text is unchanged), so a batch planned then stages the same."""
    spec = parse_spec(spec_with(source__format="debezium", source__schema_registry={}, target__mode="upsert",
                                target__key=["order_id"]))
    assert (spec.format, spec.evolve, spec.format_options, [c.name for c in spec.columns]) == (
        "debezium", "none", (), ["order_id", "customer", "amount", "ts"])
    assert spec.version == "d41c03b281b82a49"  # what the code before source.converter (78b724d) gave it
    with pytest.raises(SpecError, match="missing required key 'schema'"):
        parse_spec(spec_with(source={"topics": ["orders"], "format": "debezium", "schema_registry": {}},
                             target__mode="upsert", target__key=["order_id"]))


def test_avro_debezium_without_a_registry_url_is_refused_at_load():
    from ledgerbatch.errors import ConfigError
    from ledgerbatch.spec.resolve import with_registry

    spec = parse_spec(spec_with(source__format="debezium", source__converter="avro", target__mode="upsert",
                                target__key=["order_id"]))
    with pytest.raises(ConfigError, match="format debezium with converter avro needs a schema registry url"):
        with_registry(spec, {})
    assert dict(with_registry(spec, {"url": "http://r"}).format_options) == {"url": "http://r"}


UPSERT = {"target__mode": "upsert", "target__key": ["order_id"]}


@pytest.mark.parametrize("changes, message", [
    ({"target__version": "ts"}, "target.version orders the changes of a key: it needs target.mode upsert, not append"),
    ({**UPSERT, "target__version": ["ts"]}, "target.version must be a column name, got ['ts']"),
    ({**UPSERT, "target__version": "seen"}, "target.version column 'seen' is not in source.schema"),
    ({**UPSERT, "target__version": "customer"}, "target.version column 'customer' is STRING: a version must be one of "
                                                "SMALLINT, INT, BIGINT, DECIMAL, DATE, TIMESTAMP"),
    ({**UPSERT, "target__version": "order_id"}, "target.version 'order_id' is a key column"),
    ({**UPSERT, "target__version": "source.lsn"}, "target.version source.lsn is a position in a Debezium change event"),
    ({**UPSERT, "target__version": "_timestamp"}, "target.version _timestamp (the Kafka record timestamp) needs "
                                                  "source.metadata: [timestamp]"),
    ({**UPSERT, "target__deletes": True, "target__version": "ts"}, "a tombstone has no value to take the version from"),
    ({**UPSERT, "target__version": "ts", "transform": "SELECT * FROM batch"}, "target.version with a query transform"),
    ({**UPSERT, "target__version": "x; drop"}, "not a valid identifier"),
])
def test_bad_versions_get_clear_errors(changes, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
                       .replace("[", r"\[").replace("]", r"\]")):
        parse_spec(spec_with(**changes))


def test_versions_name_a_column_the_metadata_timestamp_or_a_debezium_position():
    column = parse_spec(spec_with(**UPSERT, target__version="ts"))
    assert column.version_by == "ts" and column.required == ("order_id", "ts")
    stamped = parse_spec(spec_with(**UPSERT, target__deletes=True, target__version="_timestamp",
                                   source__metadata=["timestamp"]))
    assert stamped.version_by == "_timestamp" and stamped.required == ("order_id",)  # Kafka always gives one
    cdc = parse_spec(spec_with(**UPSERT, source__format="debezium", target__version="source.lsn"))
    assert cdc.version_by == "_source_lsn" and cdc.columns[-1].name == "_source_lsn"
    assert cdc.columns[-1].pg_type == "bigint" and cdc.required == ("order_id", "_source_lsn")
    assert parse_spec(spec_with(**UPSERT)).version_by is None


def test_intake_limits_and_start_times():
    s = parse_spec(spec_with(batch={"max_records": 5000, "max_records_per_partition": 1000, "min_records": 500,
                                    "max_delay": "5m"}, source__start={"time": "2026-11-01T00:00:00Z"}))
    assert (s.max_records_per_partition, s.min_records, s.max_delay_s) == (1000, 500, 300.0)
    assert (s.start, s.start_time) == ("time", "2026-11-01T00:00:00Z")
    assert parse_spec(spec_with(batch={"max_records": 10, "min_records": 5, "max_delay": 90})).max_delay_s == 90.0
    sizes = [parse_spec(spec_with(batch={"max_bytes": b})).max_bytes for b in (4096, "64MiB", "2 kB", "1GB")]
    assert sizes == [4096, 64 * 1024 ** 2, 2000, 10 ** 9]
    plain = parse_spec(MINIMAL)
    assert (plain.max_records_per_partition, plain.max_bytes, plain.min_records, plain.start_time) == (None, None, 1,
                                                                                                      None)


@pytest.mark.parametrize("changes, message", [
    ({"target__partitions": {"max": 1}}, "target.partitions.max must be an integer of at least 2, got 1"),
    ({"target__partitions": {"attach_min_rows": 0}}, "target.partitions.attach_min_rows must be an integer of at least 1"),
    ({"target__partitions": {"most": 3}}, "target.partitions"),
    ({"target__mode": "upsert", "target__key": ["order_id"], "target__partitions": {"max": 8}},
     "target.partitions is only used with target.mode append"),
    ({"history": {"compact_after": "a week"}}, "history.compact_after must be seconds or a duration such as 90s"),
    ({"history": {"compact_after": 0}}, "history.compact_after must be longer than 0"),
    ({"history": {"keep": "7d"}}, "history"),
    ({"errors__quarantine_retention": "30 days"}, "errors.quarantine_retention must be seconds or a duration"),
])
def test_bad_history_settings_get_clear_errors(changes, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse_spec(spec_with(**changes))


def test_history_settings():
    s = parse_spec(spec_with(target__partitions={"max": 8, "attach_min_rows": 1000}, history={"compact_after": "7d"},
                             errors__quarantine_retention="30d"))
    assert (s.max_partitions, s.attach_min_rows, s.compact_after_s, s.quarantine_retention_s) == (8, 1000, 7 * 86400,
                                                                                                30 * 86400)
    plain = parse_spec(MINIMAL)
    assert (plain.max_partitions, plain.attach_min_rows, plain.compact_after_s, plain.quarantine_retention_s) == (
        None, None, None, None)


def test_upkeep_settings_leave_the_spec_version_as_it_was():
    """Compaction, retention and the partition layout change no batch's result: an open batch is not asked to be
    abandoned when they change. Anything else still makes a new version."""
    plain = parse_spec(MINIMAL)
    kept = parse_spec(spec_with(target__partitions={"max": 8}, history={"compact_after": "7d"},
                                errors__quarantine_retention="30d"))
    assert kept.version == plain.version
    assert parse_spec(spec_with(errors__max_ratio=0.1)).version != plain.version

"""Pipeline specs: `pipelines/NAME.yaml`, loaded and validated into one immutable value."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from ledgerbatch.errors import LedgerbatchError, SpecError, SpecVersionError
from ledgerbatch.formats.decoders.catalog import CHANGE_FORMATS, DEBEZIUM_AVRO, FORMATS, REGISTRY_FORMATS
from ledgerbatch.formats.decoders.confluent_wire import CLIENT_OPTIONS
from ledgerbatch.formats.schema import METADATA, Column, parse_schema
from ledgerbatch.identifiers import check_ident, qualified
from ledgerbatch.model.times import SECONDS_PER, epoch_ms
from ledgerbatch.source.client_settings import check_spec_settings
from ledgerbatch.spec.secrets import redacted
from ledgerbatch.spec.sql_rights import check_sql
from ledgerbatch.spec.yaml_text import load_yaml

ON_NEW_DATA = "on_new_data"
_TOP_KEYS = {"name", "source", "target", "batch", "errors", "transform", "schedule", "description", "history"}
_SECTION_KEYS = {
    "source": {"topics", "format", "converter", "schema", "start", "kafka", "metadata", "schema_registry"},
    "target": {"table", "mode", "key", "evolve", "measures", "deletes", "version", "partitions"},
    "batch": {"max_records", "max_records_per_partition", "max_bytes", "min_records", "max_delay"},
    "errors": {"policy", "max_ratio", "min_bad", "on_reject", "quarantine_retention"},
    "history": {"compact_after"},
}
CONVERTERS = ("json", "avro")  # format debezium: Kafka Connect's JsonConverter (default) or Confluent's AvroConverter
# format debezium: `target.version` may name a position in the change event's envelope, kept as this column.
ENVELOPE_VERSIONS = {"source.lsn": "_source_lsn", "source.ts_ms": "_source_ts_ms", "ts_ms": "_ts_ms"}
VERSION_TYPES = ("SMALLINT", "INT", "BIGINT", "DECIMAL", "DATE", "TIMESTAMP")  # ordered the same in Python and SQL
MERGES = ("sum", "min", "max")  # how an aggregate batch's value merges into the target's (commit/modes/aggregate.py)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    topics: tuple[str, ...]
    columns: tuple[Column, ...]
    target_schema: str
    target_table: str
    mode: str = "append"
    key: tuple[str, ...] = ()
    start: str = "earliest"  # earliest | latest | time: a new pipeline's cursors, the last at start_time
    start_time: str | None = None  # ISO-8601: where `start: {time: ...}` starts
    max_records: int = 100_000
    max_records_per_partition: int | None = None  # at most this many offsets of one partition per batch
    max_bytes: int | None = None  # at most this many bytes of values from one partition per batch
    min_records: int = 1  # wait for this many pending offsets, unless the oldest is max_delay_s old
    max_delay_s: float = 0.0
    error_policy: str = "quarantine"
    max_error_ratio: float = 0.05
    min_bad: int = 0  # errors.max_ratio trips only above this many bad records in a batch
    on_reject: str = "quarantine"  # quarantine | fail: rows the target refuses at publish (commit/rejects.py)
    schedule: str | None = None  # cron, an Airflow preset, or ON_NEW_DATA
    kafka_options: tuple[tuple[str, str], ...] = ()
    transform: tuple[tuple[str, str], ...] = ()  # (column, Spark SQL expression over the parsed columns)
    query: str | None = None  # or one Spark SQL query over the view `batch` (stage/transform.py)
    measures: tuple[tuple[str, str], ...] = ()  # mode aggregate: (column, sum | min | max)
    format: str = "json"  # a decoder of decoders.DECODERS (debezium_avro: format debezium with converter avro)
    format_options: tuple[tuple[str, str], ...] = ()  # the decoder's settings
    metadata: tuple[str, ...] = ()  # Kafka metadata as columns: key, timestamp, headers (schema.METADATA)
    evolve: str = "none"  # none | additive: columns new to the spec are added to the target at commit
    deletes: bool = False  # upsert: a tombstone with a key deletes the key's row (always so for format debezium)
    version_by: str | None = None  # upsert: the column whose higher value wins (commit/modes/versioned.py)
    max_partitions: int | None = None  # append: partitions kept (None: partitions.MAX_PARTITIONS); rollup.py
    attach_min_rows: int | None = None  # append: a batch this big becomes a partition (None: ATTACH_MIN_ROWS)
    compact_after_s: float | None = None  # history.compact_after: `run` compacts batches this old
    quarantine_retention_s: float | None = None  # errors.quarantine_retention: bad records kept this long
    text: str = ""  # the spec's canonical text (its YAML document as sorted JSON): what `version` hashes
    # the version the same spec file had before #51 redacted secrets from its text (None: it has none); a batch
    # planned then still runs under it (check_version). Not part of the canonical text.
    version_before_redaction: str | None = field(default=None, repr=False, compare=False)

    @property
    def canonical(self) -> str:
        """The text `version` hashes and the ledger stores: the spec's canonical text (its fields, for a spec
        built in code), secrets redacted (spec/secrets.py)."""
        return self.text or repr(replace(self, kafka_options=(),
                                         format_options=tuple(redacted(dict(self.format_options)).items())))

    @property
    def version(self) -> str:
        """The spec's version: a hash of its canonical text. Deployment settings merged in later
        (with_kafka_options), columns read from a schema registry and the values of secrets are not part of it."""
        return version_of(self.canonical)

    @property
    def changes(self) -> bool:
        """Every record is a change that upserts, deletes or does nothing (decoders.ChangeDecoder)."""
        return self.deletes or self.format in CHANGE_FORMATS

    @property
    def required(self) -> tuple[str, ...]:
        """The columns a row cannot do without: the key, and the version that orders a key's changes."""
        return self.key + ((self.version_by,) if self.version_by and self.version_by != "_timestamp" else ())

    @property
    def event_driven(self) -> bool:
        """`schedule: on_new_data`: the DAG runs when its topics hold offsets the ledger has not delivered."""
        return self.schedule == ON_NEW_DATA

    @property
    def stored_columns(self) -> tuple[Column, ...]:
        """The target's columns before lineage: the schema's, then the metadata asked for."""
        return self.columns + tuple(METADATA[m] for m in self.metadata)


def load_spec(pipelines_dir: Path, name: str) -> PipelineSpec:
    path = Path(pipelines_dir) / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in Path(pipelines_dir).glob("*.yaml"))) or "none"
        raise SpecError(f"pipeline {name!r} not found: no {path} (pipelines there: {known})")
    spec = parse_spec_file(path)
    if spec.name != name:
        raise SpecError(f"{path}: name {spec.name!r} does not match the file name {name!r}")
    _check_target_is_its_own(Path(pipelines_dir), spec)
    return spec


def _check_target_is_its_own(pipelines_dir: Path, spec: PipelineSpec) -> None:
    """One pipeline per target table: a replay replaces rows by source coordinates, `verify` accounts for
    every row, and an upsert decides by the key's last delivery, each of them as if the pipeline alone
    wrote the table. (Another spec that does not parse is its own loader's problem, not this one's.)"""
    mine = (spec.target_schema, spec.target_table)
    for other in sorted(pipelines_dir.glob("*.yaml")):
        if other.stem == spec.name:
            continue
        try:
            doc = load_yaml(other.read_text())
            theirs = qualified(doc["target"]["table"], "target.table")
        except Exception:  # noqa: BLE001
            continue
        if theirs == mine:
            raise SpecError(f"pipelines {spec.name} and {other.stem} both write {'.'.join(mine)}: a target table "
                            f"belongs to one pipeline (replays, upserts and verify assume it alone writes it); "
                            f"give each its own table")


def list_specs(pipelines_dir: Path) -> list[PipelineSpec]:
    return [parse_spec_file(p) for p in sorted(Path(pipelines_dir).glob("*.yaml"))]


def parse_spec_file(path: Path) -> PipelineSpec:
    try:
        doc = load_yaml(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    try:
        return parse_spec(doc)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None


def parse_spec(doc: object) -> PipelineSpec:
    top = _mapping(doc, "the spec", _TOP_KEYS)
    source = _mapping(_required(top, "source", "spec"), "source", _SECTION_KEYS["source"])
    target = _mapping(_required(top, "target", "spec"), "target", _SECTION_KEYS["target"])
    batch = _mapping(top.get("batch", {}), "batch", _SECTION_KEYS["batch"])
    errors = _mapping(top.get("errors", {}), "errors", _SECTION_KEYS["errors"])

    name = _required(top, "name", "spec")
    if not isinstance(name, str) or not _NAME.match(name):
        raise SpecError(f"name {name!r} must be lowercase letters, digits and _ (starting with a letter)")

    topics = _required(source, "topics", "source")
    if isinstance(topics, str):
        topics = [topics]
    if not isinstance(topics, list) or not topics:
        raise SpecError("source.topics must be a non-empty list of topic names")
    for t in topics:
        if not isinstance(t, str) or not _TOPIC.match(t):
            raise SpecError(f"source.topics: {t!r} is not a valid Kafka topic name")
    if len(set(topics)) != len(topics):
        raise SpecError("source.topics lists a topic twice")

    fmt = source.get("format", "json")
    if fmt not in FORMATS:
        raise SpecError(f"source.format {fmt!r} is not supported (supported: {', '.join(FORMATS)})")
    registry = _mapping(source.get("schema_registry", {}), "source.schema_registry", set(CLIENT_OPTIONS))
    if "converter" in source:
        if fmt != "debezium":
            raise SpecError(f"source.converter is only used with source.format debezium (where it is one of "
                            f"{', '.join(CONVERTERS)}); source.format is {fmt}")
        # An explicit opt-in, never inferred from `schema_registry`: `format: debezium` with
        # `schema_registry: {}` was JSON before this key existed, and a spec valid then means the same now.
        if _choice(source["converter"], "source.converter", CONVERTERS) == "avro":
            fmt = DEBEZIUM_AVRO  # envelopes in the registry's wire format
    if fmt in REGISTRY_FORMATS:
        # Without `schema:` the columns come from the registry (registry.resolve_columns).
        columns = parse_schema(source["schema"]) if source.get("schema") is not None else ()
    else:
        if registry:
            raise SpecError("source.schema_registry is only used by the registry formats (avro, protobuf, json_schema) "
                            "and by debezium with converter avro")
        columns = parse_schema(_required(source, "schema", "source"))
    start, start_time = _start(source.get("start", "earliest"))
    metadata = source.get("metadata", [])
    if not isinstance(metadata, list) or any(m not in METADATA for m in metadata) or len(set(metadata)) != len(metadata):
        raise SpecError(f"source.metadata must be a list of distinct items from {', '.join(METADATA)}, got {metadata!r}")
    kafka_options = check_spec_settings(_mapping(source.get("kafka", {}), "source.kafka", None))

    target_schema, target_table = qualified(_required(target, "table", "target"), "target.table")
    if target_schema in ("ledger", "ledger_staging", "ledger_aggregates", "ledger_deletes"):  # ledgerbatch creates and drops tables there
        raise SpecError(f"target.table: schema {target_schema!r} belongs to ledgerbatch; choose another")
    mode = _choice(target.get("mode", "append"), "target.mode", ("append", "upsert", "aggregate"))
    query, transform = _transform(top.get("transform"))
    key = target.get("key", [])
    if isinstance(key, str):
        key = [key]
    if not isinstance(key, list):
        raise SpecError("target.key must be a list of column names")
    for k in key:
        check_ident(k, "target.key column")
    if columns and query is None:  # a query's key columns are checked against its output (stage/transform.py)
        check_columns(columns, key, transform)
    if mode in ("upsert", "aggregate") and not key:
        raise SpecError(f"target.mode {mode} needs target.key (the columns that identify a row)")
    if mode == "append" and key:
        raise SpecError("target.key is only used with target.mode upsert or aggregate")
    measures = _measures(target.get("measures"), mode, query, key)
    deletes = target.get("deletes", False)
    if not isinstance(deletes, bool):
        raise SpecError(f"target.deletes must be true or false, got {deletes!r}")
    if (deletes or fmt in CHANGE_FORMATS) and mode != "upsert":
        why = "source.format debezium" if fmt in CHANGE_FORMATS else "target.deletes"
        raise SpecError(f"{why} needs target.mode upsert with target.key (deletes remove the row of a key)")
    if (deletes or fmt in CHANGE_FORMATS) and query is not None:
        raise SpecError("transform: a query cannot see deletes; with source.format debezium or target.deletes "
                        "use per-column expressions (a mapping)")
    version_by = _version(target.get("version"), mode, fmt, deletes, query, key, metadata)
    columns = with_envelope_version(columns, version_by)
    if columns and version_by:
        check_version_column(columns, version_by)

    max_records = batch.get("max_records", 100_000)
    if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1:
        raise SpecError(f"batch.max_records must be a positive integer, got {max_records!r}")
    per_partition = batch.get("max_records_per_partition")
    if per_partition is not None and (isinstance(per_partition, bool) or not isinstance(per_partition, int)
                                      or per_partition < 1):
        raise SpecError(f"batch.max_records_per_partition must be a positive integer, got {per_partition!r}")
    max_bytes = None if batch.get("max_bytes") is None else _bytes(batch["max_bytes"], "batch.max_bytes")
    min_records = batch.get("min_records", 1)
    if isinstance(min_records, bool) or not isinstance(min_records, int) or not 1 <= min_records <= max_records:
        raise SpecError(f"batch.min_records must be a positive integer up to batch.max_records ({max_records}), "
                        f"got {min_records!r}")
    max_delay_s = _seconds(batch.get("max_delay", 0), "batch.max_delay")
    if min_records > 1 and not max_delay_s:
        raise SpecError("batch.min_records needs batch.max_delay (e.g. 5m): how long the oldest pending record "
                        "may wait for a batch to fill")
    policy = _choice(errors.get("policy", "quarantine"), "errors.policy", ("quarantine", "fail"))
    ratio = errors.get("max_ratio", 0.05)
    on_reject = _choice(errors.get("on_reject", "quarantine"), "errors.on_reject", ("quarantine", "fail"))
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        raise SpecError(f"errors.max_ratio must be a number between 0 and 1, got {ratio!r}")
    min_bad = errors.get("min_bad", 0)
    if isinstance(min_bad, bool) or not isinstance(min_bad, int) or min_bad < 0:
        raise SpecError(f"errors.min_bad must be a whole number of records, 0 or more, got {min_bad!r}")
    evolve = _choice(target.get("evolve", "additive" if fmt in REGISTRY_FORMATS else "none"), "target.evolve",
                     ("none", "additive"))
    max_partitions, attach_min_rows = _partitions(target.get("partitions"), mode)
    history = _mapping(top.get("history", {}), "history", _SECTION_KEYS["history"])
    compact_after_s = _positive_duration(history.get("compact_after"), "history.compact_after")
    retention_s = _positive_duration(errors.get("quarantine_retention"), "errors.quarantine_retention")
    schedule = top.get("schedule")
    if schedule is not None and not isinstance(schedule, str):
        raise SpecError("schedule must be a cron expression or an Airflow preset such as '@hourly'")

    return PipelineSpec(
        name=name,
        topics=tuple(topics),
        columns=columns,
        target_schema=target_schema,
        target_table=target_table,
        mode=mode,
        key=tuple(key),
        start=start,
        start_time=start_time,
        max_records=max_records,
        max_records_per_partition=per_partition,
        max_bytes=max_bytes,
        min_records=min_records,
        max_delay_s=max_delay_s,
        error_policy=policy,
        max_error_ratio=float(ratio),
        min_bad=min_bad,
        on_reject=on_reject,
        schedule=schedule,
        kafka_options=tuple(sorted(kafka_options.items())),
        transform=tuple(transform.items()),
        query=query,
        measures=measures,
        format=fmt,
        format_options=tuple(sorted((str(k), str(v)) for k, v in registry.items())),
        metadata=tuple(m for m in METADATA if m in metadata),
        evolve=evolve,
        deletes=deletes,
        version_by=version_by,
        max_partitions=max_partitions,
        attach_min_rows=attach_min_rows,
        compact_after_s=compact_after_s,
        quarantine_retention_s=retention_s,
        text=canonical_text(doc),
        version_before_redaction=_version_before_redaction(doc),
    )


UPKEEP_KEYS = (("history", None), ("errors", "quarantine_retention"), ("target", "partitions"))


def canonical_text(doc: dict, redact: bool = True) -> str:
    """The spec document as JSON with sorted keys: the same spec gives the same text whatever its YAML
    layout, comments or key order. The upkeep settings (UPKEEP_KEYS: compaction, quarantine retention, the
    partition layout) are left out: they change no batch's result, so changing them asks no open batch to
    be abandoned. Client secrets (a registry's password or token, user-info in its url) are REDACTED: the
    text is stored where the inspector role reads it, and rotating a password changes no batch's result."""
    doc = {k: dict(v) if isinstance(v, dict) else v for k, v in doc.items()}
    for section, key in UPKEEP_KEYS:
        if key is None:
            doc.pop(section, None)
        elif isinstance(doc.get(section), dict):
            doc[section].pop(key, None)
    return _json_text(_redacted_doc(doc) if redact else doc)


def _redacted_doc(doc: dict) -> dict:
    """`doc` with its client settings' secrets REDACTED (spec/secrets.py)."""
    source = doc.get("source")
    if not isinstance(source, dict):
        return doc
    return {**doc, "source": {**source, **{k: redacted(source[k]) for k in ("kafka", "schema_registry")
                                           if isinstance(source.get(k), dict)}}}


def _json_text(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=False, default=str)


def _version_before_redaction(doc: dict) -> str | None:
    before = canonical_text(doc, redact=False)
    return version_of(before) if before != canonical_text(doc) else None


def version_of(canonical: str) -> str:
    """The version of a spec whose canonical text is `canonical`."""
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def redacted_spec_text(stored: str) -> str:
    """A spec text as the ledger stored it, with its secrets REDACTED (a text stored before #51 still has
    them). A spec file's text is canonical JSON, written again as canonical_text writes it; a text with no
    secret, and any other text (a spec built in code, its repr), is returned as is."""
    try:
        doc = json.loads(stored)
    except ValueError:
        return stored
    if not isinstance(doc, dict) or _redacted_doc(doc) == doc:
        return stored
    return _json_text(_redacted_doc(doc))


def check_version(spec: PipelineSpec, batch_id: int, planned: str | None) -> None:
    """A batch runs with the spec version it was planned with, or not at all. A version planned before #51
    redacted secrets from the version's text is the same spec when this spec hashed so then."""
    if planned is not None and planned not in (spec.version, spec.version_before_redaction):
        raise SpecVersionError(
            f"batch {batch_id} of pipeline {spec.name} was planned with spec version {planned}, but the spec is now "
            f"version {spec.version}: a batch never mixes two versions. Restore the spec of version {planned} (its "
            f"text: SELECT spec_text FROM ledger.spec_versions WHERE pipeline = '{spec.name}' AND version = "
            f"'{planned}') and run again to finish the batch; the new spec then applies from the next batch. Or, "
            f"where the batch cannot finish under its version (e.g. its target change was refused), abandon it: "
            f"`ledgerbatch abandon {spec.name} {batch_id} --by NAME --reason 'spec changed'`; the next run plans "
            f"its offsets again under the new spec. Nothing of the batch is committed")


def check_columns(columns: tuple[Column, ...], key: tuple[str, ...] | list[str], transform) -> None:
    """What the spec says of its columns must name columns of the schema."""
    names = {c.name for c in columns}
    for k in key:
        if k not in names:
            raise SpecError(f"target.key column {k!r} is not in source.schema")
    for column, _ in (transform.items() if isinstance(transform, dict) else transform):
        if column not in names:
            raise SpecError(f"transform: {column!r} is not a column of source.schema")


def _seconds(value: object, what: str) -> float:
    """A duration: seconds as a number, or a string such as 90s, 5m, 1h or 30d."""
    units = SECONDS_PER
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    if isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?[smhd]", value.strip()):
        return float(value.strip()[:-1]) * units[value.strip()[-1]]
    raise SpecError(f"{what} must be seconds or a duration such as 90s, 5m, 1h or 30d, got {value!r}")


def _positive_duration(value: object, what: str) -> float | None:
    if value is None:
        return None
    seconds = _seconds(value, what)
    if seconds <= 0:
        raise SpecError(f"{what} must be longer than 0, got {value!r}")
    return seconds


def _partitions(value: object, mode: str) -> tuple[int | None, int | None]:
    """`target.partitions`: {max: partitions kept, at least 2; attach_min_rows: a batch this big is attached}."""
    if value is None:
        return None, None
    if mode != "append":
        raise SpecError(f"target.partitions is only used with target.mode append (its targets are partitioned by "
                        f"batch); target.mode is {mode}")
    section = _mapping(value, "target.partitions", {"max", "attach_min_rows"})
    limits = {"max": 2, "attach_min_rows": 1}
    for key, least in limits.items():
        n = section.get(key)
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < least):
            raise SpecError(f"target.partitions.{key} must be an integer of at least {least}, got {n!r}")
    return section.get("max"), section.get("attach_min_rows")


def _bytes(value: object, what: str) -> int:
    """A size: bytes as a positive integer, or a string such as 512KiB, 64MiB, 1GiB (or kB, MB, GB)."""
    units = {"": 1, "kB": 1000, "KiB": 1024, "MB": 1000 ** 2, "MiB": 1024 ** 2, "GB": 1000 ** 3, "GiB": 1024 ** 3}
    found = re.fullmatch(r"(\d+)\s*([A-Za-z]*)", value.strip()) if isinstance(value, str) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if found and found.group(2) in units and int(found.group(1)) > 0:
        return int(found.group(1)) * units[found.group(2)]
    raise SpecError(f"{what} must be a positive number of bytes or a size such as 512KiB, 64MiB or 1GB, got {value!r}")


def _start(value: object) -> tuple[str, str | None]:
    """`source.start`: earliest, latest, or {time: ISO-8601}: the first offset at or after that time."""
    if isinstance(value, dict):
        if set(value) != {"time"} or not isinstance(value["time"], (str, dt.datetime)):
            raise SpecError(f"source.start must be earliest, latest or {{time: ISO-8601}}, got {value!r}")
        when = value["time"].isoformat() if isinstance(value["time"], dt.datetime) else value["time"]
        try:
            epoch_ms(when)
        except LedgerbatchError as exc:
            raise SpecError(f"source.start.time: {exc}") from None
        return "time", when
    return _choice(value, "source.start", ("earliest", "latest")), None


def _version(value: object, mode: str, fmt: str, deletes: bool, query: str | None, key: list,
             metadata: list) -> str | None:
    """`target.version`: the column (or for Debezium the envelope position) whose higher value wins."""
    if value is None:
        return None
    if mode != "upsert":
        raise SpecError(f"target.version orders the changes of a key: it needs target.mode upsert, not {mode}")
    if not isinstance(value, str):
        raise SpecError(f"target.version must be a column name, got {value!r}")
    if query is not None:
        raise SpecError("target.version with a query transform: not supported; use per-column expressions (a mapping)")
    if value in ENVELOPE_VERSIONS:
        if fmt not in CHANGE_FORMATS:
            raise SpecError(f"target.version {value} is a position in a Debezium change event: only with "
                            f"source.format debezium")
        return ENVELOPE_VERSIONS[value]
    check_ident(value, "target.version")
    if value in key:
        raise SpecError(f"target.version {value!r} is a key column: a key's changes need a column of their own")
    if value == "_timestamp" and "timestamp" not in metadata:
        raise SpecError("target.version _timestamp (the Kafka record timestamp) needs source.metadata: [timestamp]")
    if deletes and fmt not in CHANGE_FORMATS and value != "_timestamp":
        raise SpecError(f"target.version {value!r} with target.deletes: a tombstone has no value to take the version "
                        f"from; use target.version: _timestamp (the Kafka record timestamp, with source.metadata: "
                        f"[timestamp])")
    return value


def with_envelope_version(columns: tuple[Column, ...], version_by: str | None) -> tuple[Column, ...]:
    """A Debezium envelope position as version (ENVELOPE_VERSIONS) is a BIGINT column of its own."""
    if columns and version_by in ENVELOPE_VERSIONS.values() and version_by not in {c.name for c in columns}:
        return columns + (Column(version_by, "BIGINT"),)
    return columns


def check_version_column(columns: tuple[Column, ...], version_by: str) -> None:
    if version_by == "_timestamp":
        return
    column = next((c for c in columns if c.name == version_by), None)
    if column is None:
        raise SpecError(f"target.version column {version_by!r} is not in source.schema")
    if column.type not in VERSION_TYPES:
        raise SpecError(f"target.version column {version_by!r} is {column.spark_ddl}: a version must be one of "
                        f"{', '.join(VERSION_TYPES)}")


def _transform(value: object) -> tuple[str | None, dict]:
    """`transform:` is one Spark SQL query over the view `batch` (a string) or per-column expressions."""
    if value is None:
        return None, {}
    if isinstance(value, str):
        if not re.search(r"\bbatch\b", value, re.I):
            raise SpecError("transform: the query must read the view `batch` (the batch's parsed records), "
                            "e.g. SELECT *, amount * 100 AS cents FROM batch")
        check_sql(value, "transform")
        return value.strip().rstrip(";"), {}
    transform = _mapping(value, "transform", None)
    for column, expression in transform.items():
        if not isinstance(expression, str) or not expression.strip():
            raise SpecError(f"transform.{column} must be a Spark SQL expression string")
        check_sql(expression, f"transform.{column}")
    return None, transform


def _measures(value: object, mode: str, query: str | None, key: list) -> tuple[tuple[str, str], ...]:
    """mode aggregate: how each non-key output column of the query merges into the target."""
    if mode != "aggregate":
        if value is not None:
            raise SpecError("target.measures is only used with target.mode aggregate")
        return ()
    if query is None:
        raise SpecError("target.mode aggregate needs transform: a Spark SQL query over `batch` that groups by "
                        "target.key, e.g. SELECT customer, count(*) AS orders FROM batch GROUP BY customer")
    measures = _mapping(value if value is not None else {}, "target.measures", None)
    if not measures:
        raise SpecError("target.mode aggregate needs target.measures: {column: sum | min | max, ...}")
    for column, how in measures.items():
        check_ident(str(column), "target.measures column")
        if how not in MERGES:
            raise SpecError(f"target.measures.{column} must be one of {', '.join(MERGES)}, got {how!r}")
        if column in key:
            raise SpecError(f"target.measures.{column}: a key column cannot be a measure")
    return tuple((str(c), h) for c, h in measures.items())


def with_kafka_options(spec: PipelineSpec, options: dict[str, str]) -> PipelineSpec:
    """The spec with the deployment's consumer settings (brokers' security, ...) under its own fetch settings,
    the only ones a spec may set (source/client_settings.py), so none of the deployment's is overridden."""
    merged = {**{str(k): str(v) for k, v in options.items()}, **dict(spec.kafka_options)}
    return replace(spec, kafka_options=tuple(sorted(merged.items())))


def _mapping(value: object, what: str, allowed: set[str] | None) -> dict:
    if not isinstance(value, dict):
        raise SpecError(f"{what} must be a mapping")
    if allowed is not None:
        unknown = sorted(set(map(str, value)) - allowed)
        if unknown:
            raise SpecError(f"{what}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")
    return value


def _required(section: dict, key: str, what: str):
    if key not in section or section[key] is None:
        raise SpecError(f"{what}: missing required key {key!r}")
    return section[key]


def _choice(value: object, what: str, options: tuple[str, ...]) -> str:
    if value not in options:
        raise SpecError(f"{what} must be one of {', '.join(options)}, got {value!r}")
    return value

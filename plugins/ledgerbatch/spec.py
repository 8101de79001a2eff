"""Pipeline specs: `pipelines/NAME.yaml`, loaded and validated into one immutable value."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from .errors import SpecError
from .identifiers import check_ident, qualified
from .decoders import DECODERS
from .schema import Column, parse_schema

_TOP_KEYS = {"name", "source", "target", "batch", "errors", "transform", "schedule", "description"}
_SECTION_KEYS = {
    "source": {"topics", "format", "schema", "start", "kafka"},
    "target": {"table", "mode", "key"},
    "batch": {"max_records"},
    "errors": {"policy", "max_ratio"},
}
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
    start: str = "earliest"
    max_records: int = 100_000
    error_policy: str = "quarantine"
    max_error_ratio: float = 0.05
    schedule: str | None = None
    kafka_options: tuple[tuple[str, str], ...] = ()
    transform: tuple[tuple[str, str], ...] = ()  # (column, Spark SQL expression over the parsed columns)
    format: str = "json"  # a decoder of decoders.DECODERS
    format_options: tuple[tuple[str, str], ...] = ()  # the decoder's settings


def load_spec(pipelines_dir: Path, name: str) -> PipelineSpec:
    path = Path(pipelines_dir) / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in Path(pipelines_dir).glob("*.yaml"))) or "none"
        raise SpecError(f"pipeline {name!r} not found: no {path} (pipelines there: {known})")
    spec = parse_spec_file(path)
    if spec.name != name:
        raise SpecError(f"{path}: name {spec.name!r} does not match the file name {name!r}")
    return spec


def list_specs(pipelines_dir: Path) -> list[PipelineSpec]:
    return [parse_spec_file(p) for p in sorted(Path(pipelines_dir).glob("*.yaml"))]


def parse_spec_file(path: Path) -> PipelineSpec:
    try:
        doc = yaml.safe_load(Path(path).read_text())
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
    if fmt not in DECODERS:
        raise SpecError(f"source.format {fmt!r} is not supported (supported: {', '.join(DECODERS)})")
    columns = parse_schema(_required(source, "schema", "source"))
    start = _choice(source.get("start", "earliest"), "source.start", ("earliest", "latest"))
    kafka_options = _mapping(source.get("kafka", {}), "source.kafka", None)

    target_schema, target_table = qualified(_required(target, "table", "target"), "target.table")
    if target_schema in ("ledger", "ledger_staging"):  # ledgerbatch creates and drops tables there
        raise SpecError(f"target.table: schema {target_schema!r} belongs to ledgerbatch; choose another")
    mode = _choice(target.get("mode", "append"), "target.mode", ("append", "upsert"))
    key = target.get("key", [])
    if isinstance(key, str):
        key = [key]
    if not isinstance(key, list):
        raise SpecError("target.key must be a list of column names")
    column_names = {c.name for c in columns}
    for k in key:
        check_ident(k, "target.key column")
        if k not in column_names:
            raise SpecError(f"target.key column {k!r} is not in source.schema")
    if mode == "upsert" and not key:
        raise SpecError("target.mode upsert needs target.key (the columns that identify a row)")
    if mode == "append" and key:
        raise SpecError("target.key is only used with target.mode upsert")

    max_records = batch.get("max_records", 100_000)
    if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1:
        raise SpecError(f"batch.max_records must be a positive integer, got {max_records!r}")
    policy = _choice(errors.get("policy", "quarantine"), "errors.policy", ("quarantine", "fail"))
    ratio = errors.get("max_ratio", 0.05)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        raise SpecError(f"errors.max_ratio must be a number between 0 and 1, got {ratio!r}")
    transform = _mapping(top.get("transform", {}), "transform", None)
    for column, expression in transform.items():
        if column not in column_names:
            raise SpecError(f"transform: {column!r} is not a column of source.schema")
        if not isinstance(expression, str) or not expression.strip():
            raise SpecError(f"transform.{column} must be a Spark SQL expression string")
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
        max_records=max_records,
        error_policy=policy,
        max_error_ratio=float(ratio),
        schedule=schedule,
        kafka_options=tuple(sorted((str(k), str(v)) for k, v in kafka_options.items())),
        transform=tuple(transform.items()),
        format=fmt,
    )


def with_kafka_options(spec: PipelineSpec, options: dict[str, str]) -> PipelineSpec:
    """The spec with deployment-wide consumer settings (security, ...) under its own."""
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

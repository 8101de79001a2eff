"""Specs of the registry formats at run time: the deployment's registry settings for the deployment's
registry (registry_settings), and columns from the registry when the spec lists none.

Without `source.schema`, the columns are the fields of the latest schema of the subject
`<first topic>-value` (TopicNameStrategy; for Debezium's Avro envelopes the fields of its `after` record),
read when the spec is loaded; with `target.evolve:
additive` (the default for registry formats) a field added in a later version becomes a new
nullable target column at the next commit.
"""
from __future__ import annotations

from dataclasses import replace

from ledgerbatch.config import Settings
from ledgerbatch.errors import ConfigError, SpecError
from ledgerbatch.formats.decoders.catalog import DEBEZIUM_AVRO, REGISTRY_FORMATS, make_decoder
from ledgerbatch.formats.decoders.confluent_wire import CLIENT_OPTIONS, registry_client
from ledgerbatch.formats.schema import parse_schema
from ledgerbatch.spec.pipeline import (
    PipelineSpec,
    check_columns,
    check_version_column,
    load_spec,
    with_envelope_version,
    with_kafka_options,
)
from ledgerbatch.spec.secrets import without_userinfo


def with_registry(spec: PipelineSpec, deployment: dict[str, str]) -> PipelineSpec:
    """The spec with the registry settings it runs with (registry_settings); the columns resolved if it
    lists none."""
    if spec.format not in REGISTRY_FORMATS:
        return spec
    unknown = sorted(set(map(str, deployment)) - set(CLIENT_OPTIONS))
    if unknown:
        raise ConfigError(f"schema registry settings {', '.join(unknown)} are unknown (allowed: {', '.join(CLIENT_OPTIONS)})")
    options = registry_settings(dict(spec.format_options), {str(k): str(v) for k, v in deployment.items()})
    if not options.get("url"):
        what = "format debezium with converter avro" if spec.format == DEBEZIUM_AVRO else f"format {spec.format}"
        raise ConfigError(f"pipeline {spec.name}: {what} needs a schema registry url: set "
                          f"source.schema_registry.url, LEDGERBATCH_SCHEMA_REGISTRY or the Airflow connection "
                          f"ledgerbatch_schema_registry")
    spec = replace(spec, format_options=tuple(sorted(options.items())))
    return spec if spec.columns else resolve_columns(spec)


def registry_settings(own: dict[str, str], deployment: dict[str, str]) -> dict[str, str]:
    """The registry client's settings: the deployment's (LEDGERBATCH_SCHEMA_REGISTRY, or the Airflow
    connection ledgerbatch_schema_registry) go only to the registry the deployment names, where they win over
    the spec's. A spec naming a registry of its own talks to it with its own settings alone, so no
    spec can have the deployment's credentials sent to a server of its author's choice."""
    if own.get("url") and not _urls(own["url"]) <= _urls(deployment.get("url", "")):
        return own
    return {**own, **deployment}


def _urls(url: str) -> set[str]:
    """The servers a registry url names (the client takes a comma-separated list, each without its last /)."""
    return {u.strip().rstrip("/") for u in url.split(",") if u.strip()}


def subject(spec: PipelineSpec) -> str:
    return f"{spec.topics[0]}-value"


def resolve_columns(spec: PipelineSpec) -> PipelineSpec:
    """Columns from the subject's latest schema."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    options = dict(spec.format_options)
    try:
        client = registry_client(options)
    except ValueError as exc:
        raise ConfigError(f"pipeline {spec.name}: schema registry settings: {without_userinfo(exc)}") from None
    try:
        latest = client.get_latest_version(subject(spec))
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:
            raise SpecError(f"pipeline {spec.name}: no schema:, and the registry has no subject {subject(spec)} "
                            f"to take the columns from; register the topic's schema or list source.schema") from None
        raise ConfigError(f"schema registry {without_userinfo(options['url'])} answered {exc.http_status_code}: {exc.error_message}") from None
    except Exception as exc:  # the transport's own errors: the registry is down or unreachable
        raise ConfigError(f"schema registry {without_userinfo(options['url'])} is not reachable: "
                          f"{without_userinfo(exc)}") from None
    try:
        ddl = _columns_ddl(spec, latest.schema)
    except ValueError as exc:
        raise SpecError(f"pipeline {spec.name}: no schema:, and {subject(spec)} version {latest.version} gives no "
                        f"columns: {exc}") from None
    try:
        columns = with_envelope_version(parse_schema(ddl), spec.version_by)
        check_columns(columns, spec.key if spec.query is None else (), spec.transform)
        if spec.version_by:
            check_version_column(columns, spec.version_by)
    except SpecError as exc:
        raise SpecError(f"pipeline {spec.name}: the columns of {subject(spec)} version {latest.version} "
                        f"({ddl}) do not make a valid schema: {exc}") from None
    return replace(spec, columns=columns)


def _columns_ddl(spec: PipelineSpec, schema) -> str:
    from ledgerbatch.formats.decoders import avro, debezium_avro, json_schema, protobuf

    if spec.format == "avro":
        return avro.columns_ddl(schema)
    if spec.format == DEBEZIUM_AVRO:
        return debezium_avro.columns_ddl(schema)
    if spec.format == "json_schema":
        return json_schema.columns_ddl(schema)
    return protobuf.columns_ddl(schema, make_decoder("protobuf", dict(spec.format_options)))


def load_pipeline(settings: Settings, name: str) -> PipelineSpec:
    """Pipeline `name` from the settings' pipelines dir, with the deployment's Kafka and registry settings."""
    return with_registry(with_kafka_options(load_spec(settings.pipelines_dir, name), settings.kafka_options),
                         settings.schema_registry)

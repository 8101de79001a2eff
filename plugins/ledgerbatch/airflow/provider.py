"""The provider entry point (pyproject.toml's `apache_airflow_provider`): Airflow finds ledgerbatch's hooks
and shows its three connection types, with their fields, in the UI's connection form."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

HOOKS = "ledgerbatch.airflow.hooks"


def get_provider_info() -> dict:
    return {
        "package-name": "ledgerbatch",
        "name": "ledgerbatch",
        "description": "Exactly-once Kafka to PostgreSQL batches with an offset ledger",
        "versions": [_version()],
        "integrations": [{"integration-name": "ledgerbatch", "external-doc-url": "https://kafka.apache.org/",
                          "tags": ["software"]}],
        "hooks": [{"integration-name": "ledgerbatch", "python-modules": [HOOKS]}],
        "connection-types": [
            {
                "hook-class-name": f"{HOOKS}.LedgerHook", "hook-name": "ledgerbatch ledger",
                "connection-type": "ledgerbatch_ledger",
                "ui-field-behaviour": {
                    "hidden-fields": [],
                    "relabeling": {"schema": "Database"},
                    "placeholders": {"host": "postgres.example.com", "port": "5432", "schema": "analytics",
                                     "extra": '{"sslmode": "require"}'},
                },
            },
            {
                "hook-class-name": f"{HOOKS}.KafkaConfigHook", "hook-name": "ledgerbatch Kafka",
                "connection-type": "ledgerbatch_kafka",
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "port", "schema", "login", "password"],
                    "relabeling": {"extra": "librdkafka settings (JSON, bootstrap.servers required)"},
                    "placeholders": {"extra": '{"bootstrap.servers": "kafka-1:9092,kafka-2:9092", '
                                              '"security.protocol": "SASL_SSL"}'},
                },
            },
            {
                "hook-class-name": f"{HOOKS}.SchemaRegistryHook", "hook-name": "ledgerbatch Schema Registry",
                "connection-type": "ledgerbatch_schema_registry",
                "ui-field-behaviour": {
                    "hidden-fields": [],
                    "relabeling": {"schema": "Scheme (http or https)", "login": "API key", "password": "API secret"},
                    "placeholders": {"host": "registry.example.com", "port": "8081", "schema": "https",
                                     "extra": '{"ssl.ca.location": "/etc/ssl/certs/ca.pem"}'},
                },
            },
        ],
    }


def _version() -> str:
    try:
        return version("ledgerbatch")
    except PackageNotFoundError:  # run from the repo's plugins/ without being installed
        return "0.0.0"

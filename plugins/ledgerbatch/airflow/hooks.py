"""Hooks: ledgerbatch's clients and settings from Airflow Connections (the hooks own the clients; operators
only hold connection ids and build their hooks in `execute`).

- `ledgerbatch_db` (type postgres): the ledger and target database.
- `ledgerbatch_kafka` (any type): extra holds librdkafka settings, at least `bootstrap.servers`.
- `ledgerbatch_schema_registry` (optional, type http): the Schema Registry of the registry formats.
- `spark_connect_default` (optional, type spark_connect, the Spark provider's): a Spark Connect server; where it
  (or LEDGERBATCH_SPARK_REMOTE) names one, the process task runs batches there instead of spark-submit.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseHook
from sqlalchemy.engine import URL

from ledgerbatch.config import Settings
from ledgerbatch.errors import ConfigError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


class LedgerHook(BaseHook):
    """The ledger and target database of a postgres connection.

    :param ledger_conn_id: The connection to use, defaults to "ledgerbatch_db". Its extra becomes the
        URL's query (sslmode, ...); a list is a repeated parameter, so `"host": ["db-a:5432", "db-b:5432"]`
        with `"target_session_attrs": "read-write"` (and no host field) names an HA pair.
    """

    conn_name_attr = "ledger_conn_id"
    default_conn_name = "ledgerbatch_db"
    conn_type = "ledgerbatch_ledger"  # its form in the UI: airflow/provider.py; a postgres connection works too
    hook_name = "ledgerbatch ledger"

    def __init__(self, ledger_conn_id: str = default_conn_name):
        super().__init__()
        self.ledger_conn_id = ledger_conn_id
        self._url: str | None = None
        self._engine: Engine | None = None
        self._connection = None  # get_asset_uri's, read once per hook

    def get_url(self) -> str:
        """The connection as a SQLAlchemy URL (psycopg2), password included; read once per hook."""
        if self._url is None:
            conn = self.get_connection(self.ledger_conn_id)
            url = URL.create("postgresql+psycopg2", username=conn.login or None, password=conn.password or None,
                             host=conn.host or None, port=conn.port or None, database=conn.schema or None,
                             query={k: tuple(map(str, v)) if isinstance(v, list) else str(v)  # sslmode, ...
                                    for k, v in conn.extra_dejson.items()})
            self._url = url.render_as_string(hide_password=False)
        return self._url

    def get_engine(self) -> Engine:
        """The engine of `get_url()` (ledgerbatch.db.make_engine: PostgreSQL, checked reachable); built once
        per hook."""
        if self._engine is None:
            from ledgerbatch.ledger.engine import make_engine

            self._engine = make_engine(self.get_url())
        return self._engine

    def get_conn(self) -> Engine:
        """The hook's client: `get_engine()`."""
        return self.get_engine()

    def get_asset_uri(self, schema: str, table: str) -> str:
        """The Asset URI of a table in this database: `postgres://host:port/database/schema/table`.

        The form the postgres provider's `sanitize_uri` normalizes to (scheme `postgres`, the port always
        given, 5432 by default; database, schema and table as the three path parts), so that a DAG of any
        provider naming the same table means the same Asset. No login or password: URIs are shown in the UI.
        Each part is percent-quoted; no host (a Unix socket) becomes `localhost`.
        """
        if self._connection is None:
            self._connection = self.get_connection(self.ledger_conn_id)
        conn = self._connection
        host = conn.host or "localhost"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # IPv6
        parts = (conn.schema or conn.login or "postgres", schema, table)  # libpq: no dbname is the user's
        return f"postgres://{host}:{conn.port or 5432}/" + "/".join(quote(p, safe="") for p in parts)


class KafkaConfigHook(BaseHook):
    """Kafka client settings of a connection whose extra holds librdkafka settings.

    ledgerbatch reads explicit offset ranges only, so the hook builds no consumer itself: it returns the
    bootstrap servers, the deployment's consumer options (security, ...) and ready consumer settings
    (ledgerbatch.kafka.consumer_config) for the planner's and the readers' consumers.

    :param kafka_conn_id: The connection to use, defaults to "ledgerbatch_kafka". Its extra needs at least
        `bootstrap.servers`.
    """

    conn_name_attr = "kafka_conn_id"
    default_conn_name = "ledgerbatch_kafka"
    conn_type = "ledgerbatch_kafka"  # a generic connection works too
    hook_name = "ledgerbatch Kafka"

    def __init__(self, kafka_conn_id: str = default_conn_name):
        super().__init__()
        self.kafka_conn_id = kafka_conn_id
        self._config: dict[str, str] | None = None

    def get_config(self) -> dict[str, str]:
        """The connection's librdkafka settings as strings, `bootstrap.servers` included; read once per hook."""
        if self._config is None:
            extra = dict(self.get_connection(self.kafka_conn_id).extra_dejson)
            if not extra.get("bootstrap.servers"):
                raise ConfigError(f"connection {self.kafka_conn_id} needs `bootstrap.servers` in its extra")
            self._config = {str(k): str(v) for k, v in extra.items()}
        return dict(self._config)

    def get_bootstrap_servers(self) -> str:
        return self.get_config()["bootstrap.servers"]

    def get_options(self) -> dict[str, str]:
        """The deployment-wide consumer options: every setting but `bootstrap.servers` (Settings.kafka_options,
        LEDGERBATCH_KAFKA_OPTIONS of the Spark job)."""
        options = self.get_config()
        del options["bootstrap.servers"]
        return options

    def get_consumer_config(self, options: Mapping[str, Any] | None = None) -> dict:
        """Ready settings of a ledgerbatch consumer: the connection's options under `options` (a spec's own
        `source.kafka`, as ledgerbatch.spec.with_kafka_options merges them), the exactness settings over all."""
        from ledgerbatch.source.kafka import consumer_config

        return consumer_config(self.get_bootstrap_servers(), {**self.get_options(), **dict(options or {})})

    def get_conn(self) -> dict:
        """The hook's client settings: `get_consumer_config()`."""
        return self.get_consumer_config()


class SchemaRegistryHook(BaseHook):
    """Client settings of a Confluent-compatible Schema Registry (the registry formats).

    :param registry_conn_id: The connection to use, defaults to "ledgerbatch_schema_registry": host (with
        its scheme) and port make the URL, login and password the basic auth, extra any other setting of
        confluent-kafka's SchemaRegistryClient. Absent, pipelines rely on their spec's
        `source.schema_registry`.
    """

    conn_name_attr = "registry_conn_id"
    default_conn_name = "ledgerbatch_schema_registry"
    conn_type = "ledgerbatch_schema_registry"  # an http connection works too
    hook_name = "ledgerbatch Schema Registry"

    def __init__(self, registry_conn_id: str = default_conn_name):
        super().__init__()
        self.registry_conn_id = registry_conn_id

    def get_config(self) -> dict[str, str]:
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            conn = self.get_connection(self.registry_conn_id)
        except AirflowNotFoundException:
            return {}
        config = {str(k): str(v) for k, v in conn.extra_dejson.items()}
        if conn.host:  # the scheme: in the host, else the schema field (as HttpHook reads it), else the type's
            scheme = conn.schema or ("https" if conn.conn_type == "https" else "http")
            host = conn.host if "://" in conn.host else f"{scheme}://{conn.host}"
            config["url"] = f"{host}:{conn.port}" if conn.port else host
        if conn.login:
            config["basic.auth.user.info"] = f"{conn.login}:{conn.password or ''}"
        return config

    def get_conn(self) -> dict[str, str]:
        return self.get_config()


SPARK_CONNECT_CONN_ID = "spark_connect_default"  # the Spark provider's SparkConnectHook.default_conn_name


def spark_connect_url(conn_id: str = SPARK_CONNECT_CONN_ID) -> str | None:
    """The Spark Connect server the process task runs batches on, or None (spark-submit).

    The `spark_connect` connection `conn_id` as the Spark provider's SparkConnectHook builds its URL
    (`sc://host:port/;user_id=LOGIN;token=PASSWORD;use_ssl=...`, from host, port, login, password and the
    extra's `use_ssl`); without that connection, LEDGERBATCH_SPARK_REMOTE (`sc://host:port`).
    """
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return SparkConnectHook(conn_id).get_connection_url()
    except AirflowNotFoundException:
        return os.environ.get("LEDGERBATCH_SPARK_REMOTE") or None


def settings_from_hooks(ledger: LedgerHook, kafka: KafkaConfigHook, pipelines_dir: str | Path,
                        registry: SchemaRegistryHook | None = None) -> Settings:
    """The same Settings the CLI reads from the environment, from the hooks' connections instead."""
    kafka_options = kafka.get_options()
    bootstrap = kafka.get_bootstrap_servers()
    return Settings(db_url=ledger.get_url(), bootstrap_servers=bootstrap, pipelines_dir=pipelines_dir,
                    spark_master="", kafka_options=kafka_options,
                    schema_registry=(registry or SchemaRegistryHook()).get_config())


def settings_from_connections(ledger_conn_id: str, kafka_conn_id: str, pipelines_dir: str | Path) -> Settings:
    """The same Settings the CLI reads from the environment, from Airflow Connections instead."""
    return settings_from_hooks(LedgerHook(ledger_conn_id), KafkaConfigHook(kafka_conn_id), pipelines_dir)

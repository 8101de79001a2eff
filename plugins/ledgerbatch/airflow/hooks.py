"""Hooks: ledgerbatch settings from Airflow Connections.

- `ledgerbatch_db` (type postgres): the ledger and target database.
- `ledgerbatch_kafka` (any type): extra holds librdkafka settings, at least `bootstrap.servers`.
"""
from __future__ import annotations

from airflow.sdk import BaseHook
from sqlalchemy.engine import URL

from ..config import Settings
from ..errors import ConfigError


class LedgerHook(BaseHook):
    conn_name_attr = "ledger_conn_id"
    default_conn_name = "ledgerbatch_db"
    conn_type = "postgres"
    hook_name = "ledgerbatch ledger"

    def __init__(self, ledger_conn_id: str = default_conn_name):
        super().__init__()
        self.ledger_conn_id = ledger_conn_id

    def get_url(self) -> str:
        conn = self.get_connection(self.ledger_conn_id)
        url = URL.create("postgresql+psycopg2", username=conn.login or None, password=conn.password or None,
                         host=conn.host or None, port=conn.port or None, database=conn.schema or None,
                         query={k: str(v) for k, v in conn.extra_dejson.items()})  # sslmode, ...
        return url.render_as_string(hide_password=False)


class KafkaConfigHook(BaseHook):
    conn_name_attr = "kafka_conn_id"
    default_conn_name = "ledgerbatch_kafka"
    conn_type = "generic"
    hook_name = "ledgerbatch Kafka"

    def __init__(self, kafka_conn_id: str = default_conn_name):
        super().__init__()
        self.kafka_conn_id = kafka_conn_id

    def get_config(self) -> dict[str, str]:
        extra = dict(self.get_connection(self.kafka_conn_id).extra_dejson)
        if not extra.get("bootstrap.servers"):
            raise ConfigError(f"connection {self.kafka_conn_id} needs `bootstrap.servers` in its extra")
        return {str(k): str(v) for k, v in extra.items()}


def settings_from_connections(ledger_conn_id: str, kafka_conn_id: str, pipelines_dir: str) -> Settings:
    """The same Settings the CLI reads from the environment, from Airflow Connections instead."""
    kafka = KafkaConfigHook(kafka_conn_id).get_config()
    bootstrap = kafka.pop("bootstrap.servers")
    return Settings(db_url=LedgerHook(ledger_conn_id).get_url(), bootstrap_servers=bootstrap,
                    pipelines_dir=pipelines_dir, spark_master="", kafka_options=kafka)

"""The peer: Airflow's own Kafka consumer (ConsumeFromTopicOperator) with batch INSERTs into PostgreSQL.

At-least-once: offsets are committed to the consumer group after each batch's INSERT commits, so a
crash between the two re-delivers that batch. Configured by bench/peer.py through the environment.
"""
from __future__ import annotations

import json
import os

import pendulum
import psycopg2
from psycopg2.extras import execute_values

from airflow.providers.apache.kafka.operators.consume import ConsumeFromTopicOperator
from airflow.sdk import DAG

_pg = None


def insert_batch(messages, dsn: str, table: str) -> None:
    global _pg
    if _pg is None:  # one connection per task process, as a user's callable would keep
        _pg = psycopg2.connect(dsn)
    rows = []
    for m in messages:
        o = json.loads(m.value())
        rows.append((o.get("order_id"), o.get("customer"), o.get("amount"), o.get("ts"), m.topic(), m.partition(), m.offset()))
    with _pg.cursor() as cur:
        execute_values(cur, f"INSERT INTO {table} VALUES %s", rows, page_size=1000)
    _pg.commit()


with DAG("bench_peer", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False) as dag:
    ConsumeFromTopicOperator(
        task_id="consume",
        kafka_config_id="bench_kafka",
        topics=[os.environ.get("BENCH_PEER_TOPIC", "bench")],
        apply_function_batch=insert_batch,
        apply_function_kwargs={"dsn": os.environ.get("BENCH_PEER_DSN", ""), "table": os.environ.get("BENCH_PEER_TABLE", "peer_orders")},
        commit_cadence="end_of_batch",
        max_messages=int(os.environ.get("BENCH_PEER_RECORDS", "1")),
        max_batch_size=int(os.environ.get("BENCH_PEER_BATCH", "10000")),
        poll_timeout=float(os.environ.get("BENCH_PEER_POLL_TIMEOUT", "10")),
    )

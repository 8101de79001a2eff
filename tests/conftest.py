"""Shared fixtures: the real PostgreSQL server, a real Apache Kafka, local Spark, pipelines in a temp dir."""
from __future__ import annotations

import itertools
import logging
import os
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "plugins"))


def per_worker(name: str) -> str:
    """`name` for this test process: pytest-xdist's workers (CI runs two) each get their own database."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return f"{name}_{worker}" if worker else name


TEST_DB = per_worker(os.environ.get("LEDGERBATCH_TEST_DB", "ledgerbatch_test"))  # separate sessions need separate names
logging.getLogger("py4j").setLevel(logging.WARNING)  # its clean-up logs after pytest closed the streams
_names = itertools.count()

# Airflow reads its configuration at import: a throw-away home with this repo's dags/ and plugins/.
AIRFLOW_HOME = tempfile.mkdtemp(prefix="ledgerbatch-airflow-test-")
os.environ.update({
    "AIRFLOW_HOME": AIRFLOW_HOME,
    "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME}/airflow.db",
})


@pytest.fixture(scope="session")
def db_url() -> str:
    """A fresh, migrated ledger database on the configured server."""
    from ledgerbatch.config import Settings
    from ledgerbatch.ledger.engine import fresh_database, make_engine
    from ledgerbatch.ledger.migrations import migrate

    url = fresh_database(Settings.from_env().db_url, TEST_DB)
    engine = make_engine(url)
    migrate(engine)
    engine.dispose()
    return url


@pytest.fixture(scope="session")
def engine(db_url):
    from ledgerbatch.ledger.engine import make_engine

    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def broker():
    """A real Apache Kafka 2.3 (ZooKeeper and one broker on loopback, dev/kafka.py). The broker checks retention
    every second, so a topic's short retention.ms takes effect within a test."""
    from ledgerbatch.dev.kafka import LocalKafka

    # No time limit by default (a topic's own retention.ms still applies): records stamped days ago would
    # otherwise leave the log under the broker's default 7 days.
    with LocalKafka(1, {"log.retention.check.interval.ms": "1000", "log.segment.delete.delay.ms": "0",
                        "log.retention.ms": "-1"}) as k:
        yield k
        # Its logs go with its directory: no controlled shutdown to wait for. SIGTERM never ended it within
        # close()'s 30 s grace time, so every test session (each xdist worker) waited 30 s at its end.
        for broker_id in list(k._brokers):
            k.kill_broker(broker_id)


@pytest.fixture(scope="session")
def mock_broker():
    """librdkafka's mock cluster (dev/broker.py), only for what a real broker cannot do on demand: every
    broker dropping its connections at once and coming back a moment later (rd_kafka_mock_broker_set_down)."""
    from ledgerbatch.dev.broker import DevBroker

    with DevBroker(3) as b:
        yield b


@pytest.fixture(scope="session")
def registry():
    """The dev schema registry (ledgerbatch.devregistry), a real HTTP server for the registry formats."""
    from ledgerbatch.dev.registry import DevRegistry

    with DevRegistry() as reg:
        yield reg


@pytest.fixture(scope="session")
def spark():
    from ledgerbatch.spark.session import get_spark

    s = get_spark("local[2]", "ledgerbatch-tests")
    yield s
    s.stop()


class Pipeline:
    """A uniquely named pipeline, topic and target table, with its spec written to a temp pipelines dir."""

    def __init__(self, directory: Path, broker, partitions: int, topic_config: dict | None = None, **overrides):
        n = next(_names)
        self.name = f"p{os.getpid()}_{n}"
        self.topic = f"t_{self.name}"
        self.table = f"target_{self.name}"
        self.dir = directory
        self.partitions = partitions
        broker.create_topic(self.topic, partitions, **({"config": topic_config} if topic_config else {}))
        doc = {
            "name": self.name,
            "source": {"topics": [self.topic], "format": "json",
                       "schema": "order_id STRING, customer STRING, amount DECIMAL(12,2), ts TIMESTAMP"},
            "target": {"table": f"public.{self.table}", "mode": "append"},
            "batch": {"max_records": 100_000},
            "errors": {"policy": "quarantine", "max_ratio": 0.5},
        }
        for key, value in overrides.items():
            section, _, field = key.partition("__")
            if field:
                doc[section][field] = value
            else:
                doc[section] = value
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{self.name}.yaml").write_text(yaml.safe_dump(doc))

    @property
    def spec(self):
        from ledgerbatch.spec.pipeline import load_spec

        return load_spec(self.dir, self.name)


@pytest.fixture
def make_pipeline(tmp_path, broker):
    """`topic_config` sets the topic's configuration (retention, compaction)."""
    def make(partitions: int = 4, topic_config: dict | None = None, **overrides) -> Pipeline:
        return Pipeline(tmp_path / "pipelines", broker, partitions, topic_config, **overrides)
    return make

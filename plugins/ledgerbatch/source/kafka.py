"""Kafka metadata through the ordinary confluent-kafka client: partitions and read_committed end offsets."""
from __future__ import annotations

import functools
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ledgerbatch.errors import ConfigError, UnavailableError
from ledgerbatch.model.ranges import TopicPartition as TP
from ledgerbatch.model.ranges import Watermarks
from ledgerbatch.source import looks
from ledgerbatch.source.client_settings import SAFETY

METADATA_TIMEOUT_S = 15.0


def consumer_config(bootstrap_servers: str, options: dict[str, str] | None = None) -> dict:
    """Settings of every ledgerbatch consumer: explicit offsets only, never a committed group offset.
    `options` are the deployment's with a spec's checked `source.kafka` (spec/pipeline.py: with_kafka_options)."""
    conf = {"bootstrap.servers": bootstrap_servers, "group.id": "ledgerbatch", "log_level": 3}
    conf.update(options or {})
    conf.update(SAFETY)  # never overridable: they are what makes the ranges exact
    return conf


# ListOffsets' special timestamps: the log start, and the end (the last stable offset under read_committed)
EARLIEST, LATEST = -2, -1


def watermarks(bootstrap_servers: str, topics: tuple[str, ...], options: dict[str, str] | None = None) -> dict[TP, Watermarks]:
    """Log start and last stable offset (read_committed end) of every partition of `topics`: one ListOffsets
    request a kind for all of them (a request per partition took 89-214 ms for 32, against 62-75 ms). While a
    service runs, in a round with every other pipeline's look (looks.py)."""
    conf = consumer_config(bootstrap_servers, options)
    shared = looks.looker(conf, functools.partial(_round, bootstrap_servers))
    if shared is not None:
        return shared.look(tuple(topics))
    consumer = Consumer(conf)
    try:
        partitions = [tp for topic in topics for tp in _partitions(consumer, bootstrap_servers, topic)]
        return _watermarks(consumer, bootstrap_servers, partitions)
    except KafkaException as exc:
        raise _unreachable(bootstrap_servers, exc) from None
    finally:
        consumer.close()


def _round(bootstrap_servers: str, consumer, topics: list[str]) -> dict:
    """A round of shared looks (looks.py): topic -> its partitions' watermarks, or the topic's own error. Kafka
    unreachable fails the round at its first topic, not after a wait per topic."""
    found: dict = {}
    for topic in topics:
        try:
            found[topic] = _partitions(consumer, bootstrap_servers, topic)
        except (UnavailableError, ConfigError) as exc:
            found[topic] = exc
        except KafkaException as exc:
            raise _unreachable(bootstrap_servers, exc) from None
    try:
        marks = _watermarks(consumer, bootstrap_servers, [tp for tps in found.values() if isinstance(tps, list)
                                                          for tp in tps])
    except KafkaException as exc:
        raise _unreachable(bootstrap_servers, exc) from None
    return {t: tps if isinstance(tps, Exception) else {tp: marks[tp] for tp in tps} for t, tps in found.items()}


def _partitions(consumer, bootstrap_servers: str, topic: str) -> list[TP]:
    metadata = consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        reason = metadata.error.str() if metadata is not None and metadata.error else "no partitions"
        message = f"topic {topic!r} is not available on {bootstrap_servers}: {reason}"
        if metadata is not None and metadata.error is not None and (
                metadata.error.retriable() or metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            # no leader while a broker restarts; a topic unknown while no broker answers (librdkafka's
            # cache says so): a follower waits, a fresh run (which has never read it) stops
            raise UnavailableError(message, "Kafka")
        raise ConfigError(message)
    return [(topic, p) for p in sorted(metadata.partitions)]


def _watermarks(consumer, bootstrap_servers: str, partitions: list[TP]) -> dict[TP, Watermarks]:
    if not partitions:
        return {}
    low, high = (_list_offsets(consumer, partitions, spec) for spec in (EARLIEST, LATEST))
    return {tp: Watermarks(low[tp], high[tp]) for tp in partitions}


def _unreachable(bootstrap_servers: str, exc: KafkaException) -> UnavailableError:
    return UnavailableError(f"Kafka at {bootstrap_servers} is not reachable: {exc.args[0].str()}", "Kafka")


def _list_offsets(consumer, partitions: list[TP], spec: int) -> dict[TP, int]:
    found = consumer.offsets_for_times([TopicPartition(t, p, spec) for t, p in partitions], timeout=METADATA_TIMEOUT_S)
    for tp in found:
        if tp.error is not None:
            raise KafkaException(tp.error)
    return {(tp.topic, tp.partition): tp.offset for tp in found}


def offsets_at(bootstrap_servers: str, ends: dict[TP, Watermarks], ms: int,
               options: dict[str, str] | None = None) -> dict[TP, int]:
    """Per partition of `ends`, the first offset whose record timestamp is at or after `ms` (Kafka's
    ListOffsets by time); the end offset where no record is that late."""
    consumer = Consumer(consumer_config(bootstrap_servers, options))
    try:
        found = _list_offsets(consumer, sorted(ends), ms)
    except KafkaException as exc:
        raise ConfigError(f"offset look-up by time failed: {exc.args[0].str()}; give offsets instead") from None
    finally:
        consumer.close()
    return {tp: ends[tp].high if offset < 0 else offset for tp, offset in found.items()}


def timestamps_at(bootstrap_servers: str, positions: dict[TP, int], options: dict[str, str] | None = None,
                  timeout_s: float = 10.0) -> dict[TP, int | None]:
    """The timestamp (epoch ms) of the first committed record at or after each position; None where none
    arrived within `timeout_s`."""
    consumer = Consumer(consumer_config(bootstrap_servers, options))
    out: dict[TP, int | None] = {tp: None for tp in positions}
    try:
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in sorted(positions.items())])
        deadline = time.monotonic() + timeout_s
        while None in out.values() and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None or out.get((msg.topic(), msg.partition())) is not None:
                continue
            out[(msg.topic(), msg.partition())] = msg.timestamp()[1]
            consumer.pause([TopicPartition(msg.topic(), msg.partition())])  # one record of each is enough
    except KafkaException as exc:
        raise UnavailableError(f"Kafka at {bootstrap_servers} is not reachable: {exc.args[0].str()}", "Kafka") from None
    finally:
        consumer.close()
    return out


LOOKBACK = 16  # offsets read before a cursor to find the last record (markers and aborted records are gaps)


def timestamps_around(bootstrap_servers: str, cursors: dict[TP, int], ends: dict[TP, Watermarks],
                      options: dict[str, str] | None = None, timeout_s: float = 10.0) -> dict[TP, tuple]:
    """Per partition, (timestamp of the first committed record at or after the cursor, of the last one
    before it), epoch ms; None where there is none or none arrived within `timeout_s`."""
    out: dict[TP, list] = {tp: [None, None] for tp in cursors}
    todo = {tp for tp, pos in cursors.items() if ends[tp].low < pos or pos < ends[tp].high}
    if not todo:
        return {tp: tuple(v) for tp, v in out.items()}
    consumer = Consumer(consumer_config(bootstrap_servers, options))
    try:
        consumer.assign([TopicPartition(t, p, max(ends[(t, p)].low, cursors[(t, p)] - LOOKBACK)) for t, p in sorted(todo)])
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.2):
                tp = (msg.topic(), msg.partition())
                if msg.error() is not None or tp not in todo:
                    continue
                kind, ms = msg.timestamp()
                if msg.offset() < cursors[tp]:
                    out[tp][1] = ms if kind else None
                elif out[tp][0] is None:
                    out[tp][0] = ms if kind else None
            for tp in sorted(todo):  # done: the first undelivered record seen, or the end reached
                part = TopicPartition(*tp)
                if out[tp][0] is not None or consumer.position([part])[0].offset >= ends[tp].high:
                    todo.discard(tp)
                    consumer.pause([part])
    except KafkaException as exc:
        raise UnavailableError(f"Kafka at {bootstrap_servers} is not reachable: {exc.args[0].str()}", "Kafka") from None
    finally:
        consumer.close()
    return {tp: tuple(v) for tp, v in out.items()}

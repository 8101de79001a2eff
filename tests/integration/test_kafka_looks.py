"""Shared Kafka looks (source/looks.py): while a service runs, every pipeline's end-offset look of one cluster is
answered in rounds by one consumer; a topic's own error fails only its looks; Kafka away fails a round once for
every look in it, not one look after another."""
from __future__ import annotations

import threading
import time

import pytest

from ledgerbatch.errors import ConfigError, UnavailableError
from ledgerbatch.source import kafka, looks

from .helpers import order_value, produce

pytestmark = pytest.mark.integration


def in_threads(look, args: list) -> list:
    """`look(arg)` for every arg at once, each in a thread; what each returned or raised."""
    out: list = [None] * len(args)

    def one(i):
        try:
            out[i] = look(args[i])
        except Exception as exc:  # noqa: BLE001 - what the look raised is the result
            out[i] = exc
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_looks_of_many_pipelines_go_in_rounds_through_one_consumer(broker, make_pipeline):
    pipes = [make_pipeline(partitions=2) for _ in range(8)]
    for i, p in enumerate(pipes):
        produce(broker.bootstrap_servers, p.topic, [(0, order_value(n)) for n in range(i + 1)])
    alone = [kafka.watermarks(broker.bootstrap_servers, (p.topic,)) for p in pipes]
    with looks.shared():
        topics = [(p.topic,) for p in pipes] * 5 + [("no_such_topic_lb",)]
        got = in_threads(lambda t: kafka.watermarks(broker.bootstrap_servers, t), topics)
        (looker,) = looks._lookers.values()  # one cluster, one set of options: one consumer
        assert looker.rounds < len(topics), looker.rounds  # looks that came together went in one round
    assert got[:-1] == alone * 5
    assert isinstance(got[-1], ConfigError) and "no_such_topic_lb" in str(got[-1])  # its own error, its alone
    assert looks._lookers == {}  # closed with the last user


def test_kafka_away_fails_a_round_of_looks_once_not_one_after_another(monkeypatch):
    monkeypatch.setattr(kafka, "METADATA_TIMEOUT_S", 1.0)
    started = time.monotonic()
    with looks.shared():
        got = in_threads(lambda t: kafka.watermarks("127.0.0.1:1", t), [(f"t{i}",) for i in range(12)])
    took = time.monotonic() - started
    assert all(isinstance(e, UnavailableError) and "not reachable" in str(e) for e in got), got
    assert took < 5, took  # a round or two of 1 s, where twelve waits one after another took 12 s


def test_settings_no_consumer_can_be_made_with_fail_every_look_at_once(broker):
    """A consumer that cannot be made (a CA file that is not there) fails each look with librdkafka's reason,
    the ones queued meanwhile and the later ones, instead of leaving them waiting for a thread that is gone."""
    from confluent_kafka import KafkaException

    options = {"security.protocol": "ssl", "ssl.ca.location": "/nonexistent/ca.pem"}
    with looks.shared():
        started = time.monotonic()
        got = in_threads(lambda _: kafka.watermarks(broker.bootstrap_servers, ("t",), options), list(range(4)))
        assert all(isinstance(e, KafkaException) and "ssl.ca.location" in str(e) for e in got), got
        with pytest.raises(KafkaException, match="ssl.ca.location"):
            kafka.watermarks(broker.bootstrap_servers, ("t",), options)
        assert time.monotonic() - started < 10

"""The consumer a metadata look (end offsets, offsets by time: source/kafka.py) uses.

A look made alone (a CLI command, a planner task) builds a consumer and closes it. While `shared()` is open (a
follower, a service of many pipelines) looks with the same settings (one cluster, one set of options) share
ONE long-lived consumer: no consumer and no broker connections made and dropped per look, every second, per
pipeline. librdkafka's handles are thread-safe, and these looks only ask (ListOffsets, Metadata), never
assign or consume. A shared consumer is closed when the last user of it is done after the last `shared()`
closed."""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from confluent_kafka import Consumer

_lock = threading.Lock()
_sharing = 0
_shared: dict[tuple, list] = {}  # settings -> [consumer, users now]


@contextlib.contextmanager
def shared() -> Iterator[None]:
    global _sharing
    with _lock:
        _sharing += 1
    try:
        yield
    finally:
        with _lock:
            _sharing -= 1
            idle = [key for key, (_, users) in _shared.items() if not _sharing and not users]
            closing = [_shared.pop(key)[0] for key in idle]
        for consumer in closing:
            consumer.close()


@contextlib.contextmanager
def consumer_for(conf: dict) -> Iterator[Consumer]:
    """A consumer with settings `conf` for metadata looks: the shared one while sharing, else its own."""
    key = tuple(sorted((k, repr(v)) for k, v in conf.items()))
    with _lock:
        entry = _shared.get(key)
        if entry is None and _sharing:
            entry = _shared[key] = [Consumer(conf), 0]
        if entry is not None:
            entry[1] += 1
    if entry is None:
        consumer = Consumer(conf)
        try:
            yield consumer
        finally:
            consumer.close()
        return
    try:
        yield entry[0]
    finally:
        with _lock:
            entry[1] -= 1
            done = not _sharing and not entry[1] and _shared.get(key) is entry
            if done:
                del _shared[key]
        if done:
            entry[0].close()

"""End-offset looks of many pipelines in one process (a service), answered in rounds by one consumer a cluster.

A look made alone (a CLI command, an Airflow task, a single follower) builds a consumer and closes it. While
`shared()` is open, every look with the same settings (one cluster, one set of options) is queued to ONE
thread that owns ONE long-lived consumer: each round it takes every look queued while the last one ran and
asks Kafka once for all their topics (kafka.py: the round). So a service of N pipelines keeps one consumer's
connections a cluster, not a consumer made and dropped per look every second per pipeline; and while Kafka is
away its 15 s metadata wait is paid once a round for every pipeline waiting, never one pipeline after another
(a consumer shared by the pipelines' threads made their waits queue: minutes for 100 pipelines). A topic's own
error (unknown, no leader) fails only the looks that asked for it; Kafka unreachable fails the whole round."""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

from confluent_kafka import Consumer

Round = Callable[[Consumer, list], dict]  # (consumer, topics) -> topic -> its result, or the exception it failed with

_lock = threading.Lock()
_sharing = 0
_lookers: dict[tuple, Looker] = {}


@contextlib.contextmanager
def shared() -> Iterator[None]:
    """While open (nested or from several threads), looks go through the lookers; the last to close stops them."""
    global _sharing
    with _lock:
        _sharing += 1
    try:
        yield
    finally:
        with _lock:
            _sharing -= 1
            closing = list(_lookers.values()) if not _sharing else []
            if closing:
                _lookers.clear()
        for looker in closing:
            looker.close()


def looker(conf: dict, round_: Round) -> Looker | None:
    """The looker for consumers of settings `conf` while sharing, made on first use; None when not sharing."""
    key = tuple(sorted((k, repr(v)) for k, v in conf.items()))
    with _lock:
        if not _sharing:
            return None
        if key not in _lookers:
            _lookers[key] = Looker(conf, round_)
        return _lookers[key]


@dataclass
class _Look:
    topics: tuple[str, ...]
    done: threading.Event = field(default_factory=threading.Event)
    result: dict = field(default_factory=dict)
    error: BaseException | None = None


class Looker:
    def __init__(self, conf: dict, round_: Round):
        self.conf, self.round = conf, round_
        self.rounds = 0  # how many rounds ran (for the logs and tests)
        self._cond = threading.Condition()
        self._queue: list[_Look] = []
        self._closed = False
        self._failed: BaseException | None = None  # its consumer could not be made (bad settings)
        self._thread = threading.Thread(target=self._run, name="kafka-looks", daemon=True)
        self._thread.start()

    def look(self, topics: tuple[str, ...]) -> dict:
        """Every topic's results merged, from the next round; raises the first error of one of `topics`."""
        look = _Look(tuple(topics))
        with self._cond:
            if self._failed is not None:
                raise self._failed
            if self._closed:
                raise RuntimeError("the shared Kafka looks are closed")
            self._queue.append(look)
            self._cond.notify()
        look.done.wait()
        if look.error is not None:
            raise look.error
        return look.result

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        try:
            consumer = Consumer(self.conf)
        except Exception as exc:  # noqa: BLE001 - settings it refuses (a missing CA file): every look with them
            with self._cond:     # fails at once, now and later, instead of waiting for a thread that is gone
                self._failed, failing, self._queue = exc, self._queue, []
            for look in failing:
                look.error = exc
                look.done.set()
            return
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._closed:
                        self._cond.wait()
                    if not self._queue:
                        return
                    looks, self._queue = self._queue, []
                topics = sorted({t for look in looks for t in look.topics})
                try:
                    found = self.round(consumer, topics)
                except Exception as exc:  # noqa: BLE001 - the round's failure is every look's, raised in its thread
                    found = dict.fromkeys(topics, exc)
                self.rounds += 1
                for look in looks:
                    failed = [found[t] for t in look.topics if isinstance(found[t], BaseException)]
                    if failed:
                        look.error = failed[0]
                    else:
                        for t in look.topics:
                            look.result.update(found[t])
                    look.done.set()
        finally:
            consumer.close()

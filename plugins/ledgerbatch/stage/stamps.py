"""Record timestamps, counted on their way through staging, for the freshness metric (ops/metrics.py).

A staging task counts each range's records by Kafka timestamp (CreateTime, or the broker's LogAppendTime) in
buckets of RESOLUTION_MS, coarsened tenfold while there are more than MAX_BUCKETS, and returns them with the
range's counts as compact text. The driver keeps a batch attempt's buckets (`kept`) until the process that
staged it commits it; each committed record is then observed as commit time minus its bucket's middle. Kept
in memory only: a batch committed by another process (an Airflow commit task, a run after a crash) is not
observed. Pure Python: executors import it."""
from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Iterable

RESOLUTION_MS = 100
MAX_BUCKETS = 1000
KEPT = 256  # attempts staged and not yet committed (or never: fenced, failed) that one process remembers


class Stamps:
    """One range's records by timestamp bucket."""

    def __init__(self):
        self.resolution, self.buckets = RESOLUTION_MS, Counter()

    def seen(self, chunks: Iterable) -> Iterable:
        """Count each chunk's timestamps (source/reader.py: Records.timestamps; None: Kafka has none) as it passes."""
        for chunk in chunks:
            self.buckets.update(ms // self.resolution for ms in chunk.timestamps if ms is not None and ms >= 0)
            while len(self.buckets) > MAX_BUCKETS:
                coarse = Counter()
                for bucket, n in self.buckets.items():
                    coarse[bucket // 10] += n
                self.resolution, self.buckets = self.resolution * 10, coarse
            yield chunk

    def text(self) -> str | None:
        return json.dumps([self.resolution, sorted(self.buckets.items())]) if self.buckets else None


def ages(texts: Iterable[str | None], now_ms: int) -> Iterable[tuple[float, int]]:
    """(seconds from the bucket's middle to `now_ms`, records) of every range's Stamps.text."""
    for t in texts:
        if t:
            resolution, buckets = json.loads(t)
            for bucket, n in buckets:
                yield max(0.0, (now_ms - (bucket * resolution + resolution / 2)) / 1000), n


class Kept:
    """What this process staged, by (batch id, attempt), until its commit takes it (at most KEPT)."""

    def __init__(self):
        self._lock, self._kept = threading.Lock(), {}

    def keep(self, batch_id: int, attempt: int, texts: list[str | None]) -> None:
        with self._lock:
            self._kept[(batch_id, attempt)] = texts
            while len(self._kept) > KEPT:
                self._kept.pop(next(iter(self._kept)))

    def take(self, batch_id: int, attempt: int) -> list[str | None]:
        with self._lock:
            return self._kept.pop((batch_id, attempt), [])


kept = Kept()

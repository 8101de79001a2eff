"""The clients the NewDataTriggers of one triggerer share, so that N event-driven pipelines hold O(1)
connections, not a consumer and a database connection each (about 95 such pipelines used up a default
max_connections of 100 by themselves): one ledger engine a database, with a small pool, and the Kafka looks of
source/looks.py, answered in rounds by one consumer a cluster and settings. A trigger holds them from the start
of its run to its cleanup; the last to let go closes them."""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from sqlalchemy.engine import Engine

from ledgerbatch.ledger.engine import make_engine
from ledgerbatch.source import looks

# A look takes a connection for a few short queries, in one of the event loop's executor threads: a few
# connections serve every trigger, and a look past them waits its turn for one.
POOL_SIZE, MAX_OVERFLOW = 2, 2

_lock = threading.Lock()
_engines: dict[str, list] = {}  # ledger URL -> [engine, triggers holding it]


@contextlib.contextmanager
def shared(url: str) -> Iterator[Engine]:
    """The ledger engine of `url` shared by every trigger holding it, and the shared Kafka looks."""
    with looks.shared(), _engine(url) as engine:
        yield engine


@contextlib.contextmanager
def _engine(url: str) -> Iterator[Engine]:
    with _lock:
        held = _engines.get(url)
        if held is not None:
            held[1] += 1
    if held is None:
        made = make_engine(url, pool_size=POOL_SIZE, max_overflow=MAX_OVERFLOW)  # checks the server: unlocked
        with _lock:
            held = _engines.setdefault(url, [made, 0])
            held[1] += 1
        if held[0] is not made:  # another trigger made one meanwhile
            made.dispose()
    try:
        yield held[0]
    finally:
        with _lock:
            held[1] -= 1
            last = held[1] == 0
            if last:
                del _engines[url]
        if last:
            held[0].dispose()

"""Kafka looks (source/looks.py): while a follower or a service runs, every look of one cluster goes through one
long-lived consumer, from any thread; closed after; a look made alone has its own."""
from __future__ import annotations

import threading

import psutil
import pytest

from ledgerbatch.source import kafka, looks

from .helpers import order_value, produce

pytestmark = pytest.mark.integration


def connections_to(bootstrap: str) -> int:
    port = int(bootstrap.split(",")[0].rsplit(":", 1)[1])
    return sum(1 for c in psutil.Process().net_connections("tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def test_looks_share_one_consumer_while_shared_and_close_it_after(broker, make_pipeline):
    pipes = [make_pipeline(partitions=2) for _ in range(3)]
    for p in pipes:
        produce(broker.bootstrap_servers, p.topic, [(0, order_value(0))])
    before = connections_to(broker.bootstrap_servers)
    with looks.shared():
        seen = []

        def look(p):
            for _ in range(5):
                seen.append(kafka.watermarks(broker.bootstrap_servers, (p.topic,))[(p.topic, 0)].high)
        threads = [threading.Thread(target=look, args=(p,)) for p in pipes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert seen == [1] * 15
        assert len(looks._shared) == 1  # fifteen looks from three threads: one consumer
        shared = connections_to(broker.bootstrap_servers) - before
        assert 1 <= shared <= 2, shared  # its bootstrap connection and the one broker's
    assert looks._shared == {}  # closed with the last user
    assert kafka.watermarks(broker.bootstrap_servers, (pipes[0].topic,))[(pipes[0].topic, 0)].high == 1
    assert looks._shared == {}  # a look alone: a consumer of its own, closed

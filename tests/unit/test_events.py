import json
import logging
import socket

import pytest

from ledgerbatch.errors import ConfigError
from ledgerbatch.ops.events import StatsdClient, phase_event
from ledgerbatch.model.batch import Batch
from ledgerbatch.model.ranges import OffsetRange


def batch(**counts) -> Batch:
    return Batch(batch_id=7, pipeline="orders", kind="live", status="staged", attempt=2, staging_table="b7_a2",
                 records_read=counts.get("read"), rows_written=counts.get("written"),
                 rows_quarantined=counts.get("quarantined"), error=None,
                 ranges=(OffsetRange("orders", 0, 0, 10), OffsetRange("orders", 1, 5, 9)), range_counts={})


def test_phase_line_is_the_fixed_format(caplog):
    with caplog.at_level(logging.INFO, logger="ledgerbatch.events"):
        obj = phase_event("plan", batch(), 0.25)
    (record,) = [r for r in caplog.records if r.name == "ledgerbatch.events"]
    assert record.levelno == logging.INFO and record.getMessage() == "phase " + json.dumps(obj, sort_keys=True)
    assert obj == {"event": "phase", "phase": "plan", "pipeline": "orders", "batch_id": 7, "attempt": 2,
                   "seconds": 0.25, "ranges": 2, "records_read": None, "rows_written": None, "rows_quarantined": None}


def test_statsd_metrics_over_udp():
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(5)
    client = StatsdClient(f"127.0.0.1:{server.getsockname()[1]}")
    phase_event("commit", batch(read=10, written=9, quarantined=1), 1.5, committed_now=True, stats=client)
    packets = {server.recv(512).decode() for _ in range(5)}
    assert packets == {"ledgerbatch.orders.commit.duration:1500.000|ms", "ledgerbatch.orders.batches_committed:1|c",
                       "ledgerbatch.orders.records_read:10|c", "ledgerbatch.orders.rows_written:9|c",
                       "ledgerbatch.orders.rows_quarantined:1|c"}


def test_a_commit_that_was_a_no_op_counts_nothing():
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(0.5)
    phase_event("commit", batch(read=10, written=9, quarantined=1), 0.1, committed_now=False,
                stats=StatsdClient(f"127.0.0.1:{server.getsockname()[1]}"))
    assert server.recv(512).decode().startswith("ledgerbatch.orders.commit.duration:")
    with pytest.raises(socket.timeout):
        server.recv(512)


def test_bad_statsd_address_is_one_clear_error():
    with pytest.raises(ConfigError, match=r"LEDGERBATCH_STATSD must be HOST:PORT, got 'localhost'"):
        StatsdClient("localhost")

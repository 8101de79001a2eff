"""Which errors `run --follow` waits out, its backoff, and the executors' DSN of an HA URL."""
import threading
import time

import psycopg2
from sqlalchemy.exc import OperationalError, ProgrammingError

from ledgerbatch.config import libpq_dsn
from ledgerbatch.errors import BatchFailedError, DataLossError, FencedError, SpecError, UnavailableError
from ledgerbatch.ops.outages import DATABASE, Backoff, OutageRider, waitable


class _PgError(Exception):
    def __init__(self, pgcode):
        super().__init__("boom")
        self.pgcode = pgcode


def test_outages_are_waited_out_and_everything_else_ends_the_run():
    assert waitable(OperationalError("SELECT 1", {}, psycopg2.OperationalError("server closed the connection"))) == DATABASE
    assert waitable(ProgrammingError("INSERT", {}, _PgError("25006"))) == DATABASE  # a standby, not yet promoted
    assert waitable(ProgrammingError("SELECT", {}, _PgError("57P01"))) == DATABASE  # terminating: admin shutdown
    assert waitable(UnavailableError("Kafka at b:9092 is not reachable", "Kafka")) == "Kafka"
    assert waitable(BatchFailedError("batch 3 attempt 1 failed: schema registry unreachable while reading schema id 3: "
                                     "...")) == "schema registry"
    assert waitable(BatchFailedError("batch 3 attempt 1 failed: server closed the connection unexpectedly")) == DATABASE
    assert waitable(BatchFailedError("batch 3 attempt 1 failed: Lost executor 1")) == "Spark"
    for final in (ProgrammingError("INSERT", {}, _PgError("42501")), SpecError("bad spec"), DataLossError("gone"),
                  FencedError("abandoned"), ValueError("a bug")):
        assert waitable(final) is None, final


def test_backoff_doubles_to_its_cap_with_jitter():
    b = Backoff(1.0, 60.0)
    for attempt, top in enumerate([1, 2, 4, 8, 16, 32, 60, 60, 60]):
        delays = [b.delay(attempt) for _ in range(200)]
        assert top / 2 <= min(delays) and max(delays) <= top and len(set(delays)) > 1


def test_an_outage_is_logged_and_counted_once_with_its_length(caplog):
    counted = []
    rider = OutageRider("orders", threading.Event(), Backoff(0.001, 0.002), lambda *a: counted.append(a))
    rider.ok()  # no outage: nothing
    for _ in range(5):
        rider.wait(DATABASE, UnavailableError("database x is not reachable", DATABASE))
    rider.ok()
    lines = [r.getMessage() for r in caplog.records if "outage" in r.getMessage()]
    assert len(lines) == 2 and lines[0].startswith("orders: outage started: database unavailable (database x is not")
    assert lines[1].startswith("orders: outage ended: database back after ") and lines[1].endswith("(5 tries)")
    assert len(counted) == 1 and counted[0][:2] == ("orders", DATABASE) and counted[0][2] > 0


def test_a_stop_during_a_wait_returns_at_once():
    stop = threading.Event()
    stop.set()
    rider = OutageRider("orders", stop, Backoff(60, 60))
    started = time.monotonic()
    rider.wait(DATABASE, UnavailableError("down", DATABASE))  # a SIGTERM sets `stop`: no 30-60 s wait
    assert time.monotonic() - started < 1


def test_an_ha_url_reaches_the_executors_with_every_host_and_setting():
    url = ("postgresql+psycopg2://lb@/ledger?host=db-a:5432&host=db-b:5433&target_session_attrs=read-write"
           "&sslmode=verify-full&sslrootcert=/etc/ca.pem&connect_timeout=5&application_name=ledgerbatch")
    assert libpq_dsn(url) == ("host='db-a,db-b' port='5432,5433' dbname='ledger' user='lb' "
                              "target_session_attrs='read-write' sslmode='verify-full' sslrootcert='/etc/ca.pem' "
                              "connect_timeout='5' application_name='ledgerbatch'")
    assert libpq_dsn("postgresql+psycopg2://lb:pw@db:5432/ledger") == "host='db' port='5432' dbname='ledger' user='lb' password='pw'"

"""Which errors `run --follow` waits out, its backoff, and the executors' DSN of an HA URL."""
import threading
import time

import psycopg2
import pytest
from sqlalchemy.exc import OperationalError, ProgrammingError

from ledgerbatch.config import libpq_dsn
from ledgerbatch.errors import BatchFailedError, DataLossError, FencedError, SpecError, UnavailableError
from ledgerbatch.ops.outages import DATABASE, Backoff, Kind, OutageRider, decide, sqlstate_decision, waitable


class _PgError(Exception):
    def __init__(self, pgcode, message="boom"):
        super().__init__(message)
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


# -- one decision (ops/outages.py: decide): only real unavailability is waited out

def test_a_batch_over_its_error_budget_or_policy_fail_is_not_an_outage():
    over = BatchFailedError("batch 1 failed, nothing committed: 10 of 10 records are bad (100.0%), more than "
                            "errors.max_ratio 50.0%. The bad records are in ledger_staging.b1_a1_bad.")
    assert waitable(over) is None and decide(over).kind is Kind.OPERATOR
    assert waitable(BatchFailedError("batch 1 failed, nothing committed: 1 of 10 records are bad and errors.policy "
                                     "is fail")) is None
    # a staging task's COPY cut by a statement_timeout: it would fail the same way on every try
    assert waitable(BatchFailedError("batch 3 attempt 1 failed: psycopg2.errors.QueryCanceled: canceling statement "
                                     "due to statement timeout")) is None


@pytest.mark.parametrize("code, message, statement, dependency", [
    ("08006", "connection failure", "", DATABASE),
    ("25006", "cannot execute INSERT in a read-only transaction", "", DATABASE),
    ("40001", "could not serialize access", "", DATABASE),
    ("40P01", "deadlock detected", "", DATABASE),
    ("53300", "sorry, too many clients already", "", DATABASE),
    ("57P01", "terminating connection due to administrator command", "", DATABASE),
    ("57P03", "the database system is starting up", "", DATABASE),
    ("57014", "canceling statement due to statement timeout",
     "SELECT pg_advisory_xact_lock(hashtext('ledgerbatch:target:' || %(target)s))", DATABASE),
    ("57014", "canceling statement due to user request", "INSERT INTO t SELECT ...", DATABASE),
    ("57014", "canceling statement due to statement timeout", "INSERT INTO t SELECT ...", None),
    ("54000", "index row size 4016 exceeds btree version 4 maximum 2704", "", None),
    ("53200", "out of shared memory. You might need to increase max_locks_per_transaction.", "", None),
    ("53400", "configuration limit exceeded", "", None),
    ("42501", "permission denied for table t", "", None),
    ("22001", "value too long for type character varying(2)", "", None),
    ("23514", "new row violates check constraint", "", None),
    ("P0001", "refused by a trigger", "", None),
    ("LB001", "refused by a trigger with its own code", "", None),
    ("XX000", "internal error", "", None),
    ("58030", "could not read block", "", None),
])
def test_sqlstates_are_decided_in_one_table(code, message, statement, dependency):
    exc = OperationalError(statement, {}, _PgError(code, message))
    assert waitable(exc) == dependency
    assert (sqlstate_decision(code, message, statement).kind is Kind.OUTAGE) == (dependency is not None)


def test_a_refused_login_is_not_an_outage_but_a_refused_connection_is():
    refused = psycopg2.OperationalError('connection to server at "db" (10.0.0.1), port 5432 failed: Connection refused')
    assert waitable(OperationalError("", {}, refused)) == DATABASE
    for said in ('FATAL:  password authentication failed for user "lb"', 'FATAL:  role "lb" does not exist',
                 'FATAL:  database "ledger" does not exist', "FATAL:  no pg_hba.conf entry for host"):
        login = psycopg2.OperationalError(f'connection to server at "db" (10.0.0.1), port 5432 failed: {said}')
        assert waitable(OperationalError("", {}, login)) is None, said


def test_a_range_read_is_an_outage_when_the_brokers_stop_answering_only():
    from ledgerbatch.source.reader import RangeReadError

    assert waitable(RangeReadError("t[0] [0, 9): no progress for 60s at offset 0", retriable=True)) == "Kafka"
    assert waitable(RangeReadError("t[0] [0, 9): offsets are no longer in Kafka: ...")) is None


def test_the_byte_measurement_turns_a_stall_into_an_outage_and_a_lost_range_into_data_loss(monkeypatch):
    from ledgerbatch.model.ranges import OffsetRange
    from ledgerbatch.source import sizes
    from ledgerbatch.source.reader import RangeReadError

    def reading(error):
        def read_messages(rng, conf, stall_s):
            raise error
            yield  # a generator, as the reader is
        return read_messages

    rng = [OffsetRange("t", 0, 0, 10)]
    monkeypatch.setattr(sizes, "read_messages", reading(RangeReadError("no progress for 60s", retriable=True)))
    with pytest.raises(UnavailableError) as stalled:
        sizes.cap_bytes(rng, 1024, {})
    assert stalled.value.dependency == "Kafka"
    monkeypatch.setattr(sizes, "read_messages", reading(RangeReadError("t[0]: offsets are no longer in Kafka: reset")))
    with pytest.raises(DataLossError):
        sizes.cap_bytes(rng, 1024, {})


def test_spark_refusing_the_query_is_the_specs_fault_not_sparks_outage():
    AnalysisException = type("AnalysisException", (Exception,), {"__module__": "pyspark.errors.exceptions.connect"})
    Unavailable = type("SparkConnectGrpcException", (Exception,), {"__module__": "pyspark.errors.exceptions.connect"})
    assert waitable(AnalysisException("[UNRESOLVED_COLUMN] amout")) is None
    assert waitable(Unavailable("failed to connect to all addresses")) == "Spark"

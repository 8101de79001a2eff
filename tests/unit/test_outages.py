"""Which errors `run --follow` waits out, its backoff, and the executors' DSN of an HA URL."""
import threading
import time
from pathlib import Path

import psycopg2
import pytest
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from ledgerbatch.config import libpq_dsn
from confluent_kafka import KafkaError, KafkaException

from ledgerbatch.errors import (BatchFailedError, ConfigError, DataLossError, FencedError, LedgerbatchError, SpecError,
                                UnavailableError)
from ledgerbatch.source.reader import RangeReadError
from ledgerbatch.ops.outages import (
    DATABASE,
    STATEMENT_TIMEOUT,
    Backoff,
    Kind,
    OutageRider,
    decide,
    lock_wait,
    row_wait,
    sqlstate_decision,
    waitable,
)


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
    assert waitable(PoolTimeout("QueuePool limit of size 5 overflow 10 reached")) == DATABASE  # many pipelines' commits
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
        down = UnavailableError("database x is not reachable", DATABASE)
        rider.wait(decide(down), down)
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
    down = UnavailableError("down", DATABASE)
    rider.wait(decide(down), down)  # a SIGTERM sets `stop`: no 30-60 s wait
    assert time.monotonic() - started < 1


def test_the_same_presumed_outage_repeating_while_the_dependencies_answer_ends_the_follower():
    """A staging task failing identically on every attempt (a decoder's bug) is not Spark's outage: after
    same_error_limit tries in a row (the attempt's number aside) with the database and Kafka answering, the
    rider raises the error the follower stops with; while they do not answer, or for an outage a dependency's
    own error names, it keeps waiting."""
    rider = OutageRider("orders", threading.Event(), Backoff(0.001, 0.002, same_error_limit=3))

    def failed(attempt: int, reason: str = "TypeError: 'NoneType' object is not subscriptable") -> BatchFailedError:
        return BatchFailedError(f"batch 7 attempt {attempt} failed: {reason} (ledger_staging.b7_a{attempt})")

    rider.wait(decide(failed(1)), failed(1), answering=lambda: True)
    rider.wait(decide(failed(2, "KeyError: 'x'")), failed(2, "KeyError: 'x'"), answering=lambda: True)  # not the same
    for attempt in (3, 4, 5):  # the same three times, but Kafka does not answer: still an outage
        rider.wait(decide(failed(attempt)), failed(attempt), answering=lambda: False)
    with pytest.raises(LedgerbatchError, match="the same error 4 times in a row while the database and Kafka "
                                               "answer: batch 7 attempt 6 failed: TypeError") as stopped:
        rider.wait(decide(failed(6)), failed(6), answering=lambda: True)
    assert "not an outage" in str(stopped.value) and "ledger.batches" in str(stopped.value)
    rider = OutageRider("orders", threading.Event(), Backoff(0.001, 0.002, same_error_limit=2))
    down = BatchFailedError("batch 7 attempt 1 failed: schema registry unreachable while reading schema id 3: x")
    for _ in range(5):  # the registry's own error names it: waited out however often it repeats
        rider.wait(decide(down), down, answering=lambda: True)


@pytest.mark.parametrize("code", ["TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED",
                                  "CLUSTER_AUTHORIZATION_FAILED", "SASL_AUTHENTICATION_FAILED", "_AUTHENTICATION"])
def test_kafka_refusing_the_clients_rights_or_credentials_is_the_operators_at_once(code):
    """Kafka 2.3 in the tests runs without ACLs or SASL: these are librdkafka's own error objects, as raised
    (KafkaException), as source/kafka.py wraps them (UnavailableError), and as their text crosses Spark."""
    error = KafkaError(getattr(KafkaError, code))
    for exc in (KafkaException(error), UnavailableError(f"Kafka at b:9092 is not reachable: {error.str()}", "Kafka"),
                ConfigError(f"topic 'orders' is not available on b:9092: {error.str()}"),  # its metadata refused
                RangeReadError(f"orders[0]: {error.str()}", retriable=True),
                BatchFailedError(f"batch 3 attempt 1 failed: RangeReadError: orders[0]: {error.str()}")):
        decision = decide(exc)
        assert decision.kind is Kind.OPERATOR and "ACLs" in decision.todo, (exc, decision)
    assert waitable(KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN))) == "Kafka"


def test_a_registry_refusing_the_credentials_or_a_grant_refused_to_a_staging_task_is_the_operators():
    for reason, todo in (("RegistryUnavailable: schema registry answered 401 for schema id 1: Unauthorized",
                          "basic.auth.user.info"),
                         ("RegistryUnavailable: schema registry answered 403 for schema id 1: Forbidden",
                          "basic.auth.user.info"),
                         ("permission denied for schema ledger_staging", "grant")):
        decision = decide(BatchFailedError(f"batch 3 attempt 1 failed: {reason}"))
        assert decision.kind is Kind.OPERATOR and todo in decision.todo, reason
    assert waitable(BatchFailedError("batch 3 attempt 1 failed: RegistryUnavailable: schema registry answered "
                                     "503 for schema id 1: Service Unavailable")) == "schema registry"


def _failed(reason: str) -> BatchFailedError:
    return BatchFailedError(f"batch 3 attempt 1 failed: {reason}")


_SparkConnect = type("SparkConnectGrpcException", (Exception,), {"__module__": "pyspark.errors.exceptions.connect"})
_Analysis = type("AnalysisException", (Exception,), {"__module__": "pyspark.errors.exceptions.connect"})
# docs/failure-and-recovery.md's "Other errors" table: each row's first cell, an error of its kind, and the
# dependency where the row says which
OTHER_ERRORS = {
    "a dependency that did not answer (`UnavailableError`)": (UnavailableError("registry down", "schema registry"),
                                                             "schema registry"),
    "a range read whose brokers stopped answering": (RangeReadError("t[0]: no progress for 60s", retriable=True),
                                                     "Kafka"),
    "librdkafka's transport errors (`KafkaException`)": (KafkaException(KafkaError(KafkaError._TRANSPORT)), "Kafka"),
    "Kafka refusing the client, as raised, wrapped or as text": (
        UnavailableError("Kafka at b:9092 is not reachable: Broker: Topic authorization failed", "Kafka"), None),
    "a failed read naming the registry, the database or Kafka": (
        _failed("server closed the connection unexpectedly"), DATABASE),
    "a failed read: the registry answered 401 or 403": (
        _failed("schema registry answered 403 for schema id 1: Forbidden"), None),
    "a failed read: a grant refused to the staging tasks": (
        _failed("permission denied for table b3_a1"), None),
    "a failed read: the staging COPY cut or refused at login": (
        _failed("canceling statement due to statement timeout"), None),
    "a failed read: too many bad records": (_failed("9 bad records, more than errors.max_ratio 0.5"), None),
    "a failed read: Spark Connect or an executor gone": (
        _failed("ExecutorLostFailure (executor 1 exited caused by one of the running tasks)"), "Spark"),
    "a failed read naming nothing else": (_failed("KeyError: 'amount'"), "Spark"),
    "Spark refusing the spec's query": (_Analysis("[UNRESOLVED_COLUMN] x"), None),
    "Spark Connect's own errors": (_SparkConnect("failed to connect to all addresses"), "Spark"),
    "ledgerbatch's own errors": (FencedError("abandoned"), None),
    "anything else": (ValueError("a bug"), None),
}


def _other_errors_table() -> list[list[str]]:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "failure-and-recovery.md").read_text()
    table = doc.split("Other errors", 1)[1].split("\n\n")[1]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_the_other_errors_table_lists_the_rows_the_contract_test_checks():
    assert [row[0] for row in _other_errors_table()] == list(OTHER_ERRORS)


@pytest.mark.parametrize("row", _other_errors_table(), ids=lambda row: row[0][:40])
def test_other_errors_are_decided_as_the_table_says(row):
    error, dependency = OTHER_ERRORS[row[0]]
    decision, said = decide(error), row[2]
    if said.startswith(("outage", "presumed outage")):
        assert decision.kind is Kind.OUTAGE and decision.dependency == dependency, decision
        assert decision.presumed == said.startswith("presumed"), decision
    else:
        assert decision.kind is (Kind.BUG if said.startswith("a bug") else Kind.OPERATOR), decision
        assert said.startswith(("stop", "a bug")), said


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
    ("57014", 'canceling statement due to statement timeout\nCONTEXT:  while locking tuple (0,1) in relation "parent"',
     "INSERT INTO t SELECT ...", DATABASE),
    ("57014", 'canceling statement due to statement timeout\nCONTEXT:  while updating tuple (0,7) in relation "t"',
     "UPDATE t SET ...", DATABASE),
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


def test_a_row_lock_wait_is_read_from_the_errors_context_and_a_holder_makes_a_timeout_a_lock_wait():
    assert row_wait('canceling statement due to statement timeout\nCONTEXT:  while inserting index tuple (3,4) in '
                    'relation "my "odd" table"\nSQL statement "SELECT 1"') == 'my "odd" table'
    assert row_wait('x\nCONTEXT:  while locking tuple (0,1) in relation "parent"') == "parent"
    assert row_wait("canceling statement due to statement timeout") is None
    assert lock_wait(STATEMENT_TIMEOUT, []) is STATEMENT_TIMEOUT
    assert lock_wait(STATEMENT_TIMEOUT, ["pid 7 (app, ShareLock, idle in transaction, ...)"]).kind is Kind.OUTAGE


@pytest.mark.parametrize("last_line", ["Is the server running on that host and accepting TCP/IP connections?",
                                       "Is the server running locally and accepting connections on that socket?",
                                       "before or while processing the request.",
                                       "psycopg2.OperationalError: could not translate host name \"db\""])
def test_a_staging_tasks_database_error_is_known_by_libpqs_last_line(last_line):
    decision = decide(_failed(last_line))
    assert decision.kind is Kind.OUTAGE and decision.dependency == DATABASE and not decision.presumed


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

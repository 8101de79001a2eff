"""The Airflow adapters without a database or a broker: hooks own the clients and settings, operators keep
only their arguments until `execute`."""
import json
from pathlib import Path

import pytest

SECURITY = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "etl",
            "sasl.password": "s3cret"}


@pytest.fixture
def connections(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LEDGERBATCH_KAFKA", json.dumps(
        {"conn_type": "generic", "extra": {"bootstrap.servers": "kafka-1:9093", **SECURITY}}))
    monkeypatch.setenv("AIRFLOW_CONN_LEDGERBATCH_DB", json.dumps(
        {"conn_type": "postgres", "host": "db", "login": "etl", "password": "pw", "schema": "ledger"}))


@pytest.fixture
def no_engines(monkeypatch):
    """make_engine records its URLs instead of connecting."""
    import ledgerbatch.ledger.engine

    made = []
    monkeypatch.setattr(ledgerbatch.ledger.engine, "make_engine", lambda url: made.append(url) or object())
    return made


def test_ledger_hook_builds_its_engine_once(connections, no_engines):
    from ledgerbatch.airflow.hooks import LedgerHook

    hook = LedgerHook()
    assert hook.get_engine() is hook.get_engine() is hook.get_conn()
    assert no_engines == [hook.get_url()] == ["postgresql+psycopg2://etl:pw@db/ledger"]


def test_kafka_hook_returns_bootstrap_options_and_ready_consumer_settings(connections, monkeypatch):
    from ledgerbatch.airflow.hooks import KafkaConfigHook
    from ledgerbatch.errors import ConfigError
    from ledgerbatch.source.kafka import consumer_config
    from ledgerbatch.spec.pipeline import parse_spec, with_kafka_options

    hook = KafkaConfigHook()
    assert hook.get_bootstrap_servers() == "kafka-1:9093"
    assert hook.get_options() == SECURITY
    spec_options = {"client.id": "orders-etl", "fetch.wait.max.ms": "50"}  # what a spec may set (fetch settings)
    conf = hook.get_consumer_config({**spec_options, "isolation.level": "read_uncommitted"})
    assert conf["isolation.level"] == "read_committed" and conf["enable.auto.commit"] is False
    assert conf["client.id"] == "orders-etl" and conf["fetch.wait.max.ms"] == "50"
    assert conf["security.protocol"] == "SASL_SSL" and conf["bootstrap.servers"] == "kafka-1:9093"
    # the same settings as the planner's consumer, built from the spec the operators load
    spec = with_kafka_options(parse_spec({"name": "orders", "source": {"topics": ["orders"], "schema": "a STRING",
                                                                       "kafka": spec_options},
                                          "target": {"table": "public.orders"}}), hook.get_options())
    assert conf == consumer_config(hook.get_bootstrap_servers(), dict(spec.kafka_options))
    assert hook.get_conn() == hook.get_consumer_config()

    monkeypatch.setenv("AIRFLOW_CONN_NO_BOOTSTRAP", json.dumps({"conn_type": "generic", "extra": {"a": "b"}}))
    with pytest.raises(ConfigError, match="needs `bootstrap.servers`"):
        KafkaConfigHook("no_bootstrap").get_config()


def test_operators_keep_only_arguments_in_init(monkeypatch, tmp_path, no_engines):
    from ledgerbatch.airflow.operators import CommitBatchOperator, LedgerbatchBaseOperator, PlanBatchOperator, PlanReplayOperator, ProcessBatchOperator, VerifyOperator

    monkeypatch.delenv("AIRFLOW_CONN_LEDGERBATCH_DB", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_LEDGERBATCH_KAFKA", raising=False)
    common = dict(pipeline="orders", pipelines_dir=str(tmp_path / "missing"))
    ops = [PlanBatchOperator(task_id="plan", **common),
           PlanReplayOperator(task_id="replay", request="{}", **common),
           ProcessBatchOperator(task_id="process", batch_id="7", **common),
           CommitBatchOperator(task_id="commit", batch_id="7", dry_run=True, **common),
           VerifyOperator(task_id="verify", ledger_conn_id="other_db", **common)]
    for op in ops:
        assert isinstance(op, LedgerbatchBaseOperator)
        assert (op.pipeline, op.pipelines_dir) == ("orders", str(tmp_path / "missing"))
        assert "pipeline" in op.template_fields
        assert not {"ledger_hook", "kafka_hook", "settings"} & set(vars(op))
    assert (ops[0].ledger_conn_id, ops[0].kafka_conn_id) == ("ledgerbatch_db", "ledgerbatch_kafka")
    assert ops[4].ledger_conn_id == "other_db" and ops[4].ledger_hook.ledger_conn_id == "other_db"
    assert no_engines == []
    process = ops[2]
    assert "batch_id" in process.template_fields and process.application_args is None
    assert process.name == "ledgerbatch-orders" and process._conn_id == "spark_default"
    assert {"request"} <= set(ops[1].template_fields) and {"batch_id", "dry_run"} <= set(ops[3].template_fields)


def test_process_passes_its_batch_id_into_the_job_arguments_at_execute(connections, no_engines, monkeypatch, tmp_path):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from ledgerbatch.airflow.operators import LedgerbatchBaseOperator, ProcessBatchOperator

    submitted, events = [], []

    def submit(self, context):  # the secret settings' file exists while the job runs, then not
        path = self.application_args[-1]
        submitted.append((self.application_args, self.env_vars, json.loads(Path(path).read_text()),
                          Path(path).stat().st_mode & 0o777))
    monkeypatch.setattr(SparkSubmitOperator, "execute", submit)
    monkeypatch.setattr(LedgerbatchBaseOperator, "_phase_event",
                        lambda self, phase, batch_id, started, **counts: events.append((phase, batch_id)))
    op = ProcessBatchOperator(task_id="process", pipeline="{{ params.pipeline }}",
                              batch_id="{{ params.batch }}", pipelines_dir=str(tmp_path))
    op.render_template_fields({"params": {"pipeline": "orders", "batch": 42}})
    assert (op.pipeline, op.batch_id, op.name) == ("orders", "42", "ledgerbatch-orders")
    op.execute({})
    ((args, env, secrets, mode),) = submitted
    assert args[:5] == ["--pipeline", "orders", "--batch-id", "42", "--settings-file"]
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == "kafka-1:9093" and "LEDGERBATCH_KAFKA_OPTIONS" not in env
    assert secrets["kafka_options"] == SECURITY and mode == 0o600
    assert not Path(args[-1]).exists()
    assert events == [("process", 42)]


def test_an_ha_ledger_connection_lists_its_hosts_in_the_extra(monkeypatch, no_engines):
    """The host list reaches the driver's URL and the executors' libpq string alike."""
    from ledgerbatch.airflow.hooks import LedgerHook
    from ledgerbatch.config import libpq_dsn

    monkeypatch.setenv("AIRFLOW_CONN_LEDGERBATCH_DB", json.dumps(
        {"conn_type": "postgres", "login": "etl", "schema": "ledger",
         "extra": {"host": ["db-a:5432", "db-b:5433"], "target_session_attrs": "read-write", "sslmode": "require"}}))
    url = LedgerHook().get_url()
    assert url == ("postgresql+psycopg2://etl@/ledger?host=db-a%3A5432&host=db-b%3A5433"
                   "&sslmode=require&target_session_attrs=read-write")
    assert libpq_dsn(url) == ("host='db-a,db-b' port='5432,5433' dbname='ledger' user='etl' sslmode='require' "
                              "target_session_attrs='read-write'")

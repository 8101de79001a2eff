"""Cluster deployment without a cluster: the executors' zip, and Kafka security settings passed from the
Airflow connection to the spark-submit job, the planner and the readers."""
import json
import subprocess
import sys
import zipfile

from ledgerbatch.spark.package import PACKAGE_DIR, package_zip
from ledgerbatch.spec.resolve import load_pipeline

SECURITY = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "etl",
            "sasl.password": "s3cret", "ssl.ca.location": "/etc/kafka/ca.pem"}


def test_package_zip_holds_the_modules_and_imports_without_the_install(tmp_path):
    path = package_zip(tmp_path)
    names = zipfile.ZipFile(path).namelist()
    assert "ledgerbatch/source/reader.py" in names and "ledgerbatch/airflow/operators.py" in names
    assert all(n.endswith(".py") for n in names)
    assert len(names) == len(list(PACKAGE_DIR.rglob("*.py")))
    # -I -S: no site-packages and no editable install, only the zip (as on an executor without the package)
    code = f"import sys; sys.path.insert(0, {path!r}); import ledgerbatch.model.ranges as r; print(r.__file__)"
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"{path}/ledgerbatch/model/ranges.py"


def test_kafka_security_from_the_connection_reaches_planner_and_readers(tmp_path, monkeypatch):
    from ledgerbatch.airflow.hooks import settings_from_connections
    from ledgerbatch.airflow.operators import ProcessBatchOperator
    from ledgerbatch.config import Settings
    from ledgerbatch.source.kafka import consumer_config
    from ledgerbatch.spark.settings_file import with_settings_file

    (tmp_path / "orders.yaml").write_text(
        "name: orders\nsource: {topics: [orders], schema: 'a STRING', kafka: {client.id: orders-etl}}\n"
        "target: {table: public.orders}\n")
    monkeypatch.setenv("AIRFLOW_CONN_LEDGERBATCH_KAFKA", json.dumps(
        {"conn_type": "generic", "extra": {"bootstrap.servers": "kafka-1:9093", **SECURITY}}))
    monkeypatch.setenv("AIRFLOW_CONN_LEDGERBATCH_DB", json.dumps(
        {"conn_type": "postgres", "host": "db", "login": "etl", "password": "pw", "schema": "ledger",
         "extra": {"sslmode": "require"}}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    settings = settings_from_connections("ledgerbatch_db", "ledgerbatch_kafka", str(tmp_path))
    op = ProcessBatchOperator(task_id="process", pipeline="orders", batch_id="42", pipelines_dir=str(tmp_path))
    private = tmp_path / "private"
    private.mkdir()
    op.prepare_submit(settings, private)
    env = op.env_vars
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == "kafka-1:9093" and "LEDGERBATCH_DB_URL" not in env
    settings_file = op.application_args[op.application_args.index("--settings-file") + 1]

    # The spark-submit job reads the same environment as the CLI, and its secret settings from the file:
    # the spec gets the security settings, and the planner's and the readers' consumers are built from the
    # spec with consumer_config.
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    job_settings = with_settings_file(Settings.from_env(), settings_file)
    assert job_settings.db_url == "postgresql+psycopg2://etl:pw@db/ledger?sslmode=require"
    spec = load_pipeline(job_settings, "orders")
    conf = consumer_config(env["KAFKA_BOOTSTRAP_SERVERS"], dict(spec.kafka_options))
    assert {k: conf[k] for k in SECURITY} == SECURITY
    assert conf["client.id"] == "orders-etl" and conf["isolation.level"] == "read_committed"

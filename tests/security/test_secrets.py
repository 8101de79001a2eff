"""Secrets are never stored, printed or on a command line (issue #51): a real run with known secrets, then
grep everything it left; the spark-submit command the process task builds for every kind of master; a
spec's own registry credentials redacted from the ledger and the version hash."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text
from sqlalchemy.engine import make_url

from ledgerbatch.config import STAGING_DB_URL
from tests.integration.helpers import REPO

pytestmark = pytest.mark.integration

DB_PW, REG_PW, SPEC_PW, KAFKA_PW = "DbPw-8c1f-Hunter2", "RegPw-5e7a-C0rrect", "SpecPw-2b9d-Horse", "KafkaPw-77aa-Tr0ub"
STAGER_PW = "StagerPw-41c3-Batt3ry"
SECRETS = (DB_PW, REG_PW, SPEC_PW, KAFKA_PW, STAGER_PW)
STAGER_URL = f"postgresql+psycopg2://stager:{STAGER_PW}@db.internal:5432/ledger"
ORDER = {"type": "record", "name": "Order", "fields": [{"name": "order_id", "type": "string"},
                                                        {"name": "amount", "type": "long"}]}


def _leaks(where: str, blob: str) -> list[str]:
    return [f"{where}: {s}" for s in SECRETS if s in blob]


@pytest.fixture
def secret_role(engine):
    """A login role with a known password, member of the ledger's owner (trust auth on 127.0.0.1 lets it in)."""
    role = f"sec_test_{os.getpid()}"
    owner = make_url(engine.url).username or "postgres"
    with engine.begin() as conn:
        conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        conn.execute(text(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{DB_PW}' IN ROLE \"{owner}\""))
    yield role
    with engine.begin() as conn:
        conn.execute(text(f'REASSIGN OWNED BY "{role}" TO "{owner}"'))
        conn.execute(text(f'DROP OWNED BY "{role}"'))
        conn.execute(text(f'DROP ROLE "{role}"'))


def _produce_avro(bootstrap: str, registry_url: str, topic: str, count: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url, "basic.auth.user.info": f"etl:{REG_PW}"})
    serialize = AvroSerializer(client, json.dumps(ORDER))
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 3})
    for i in range(count):
        producer.produce(topic, value=serialize({"order_id": f"o-{i}", "amount": i},
                                                SerializationContext(topic, MessageField.VALUE)), partition=i % 2)
    assert producer.flush(30) == 0


def _watch(pgid: int, seen: dict, stop: threading.Event) -> None:
    """Every process of the run's group, while it runs: its argv and its environment's secret variables."""
    while not stop.is_set():
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and os.getpgid(int(proc.name)) == pgid:
                    argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    env = dict(v.split("=", 1) for v in (proc / "environ").read_bytes().decode(errors="replace")
                               .split("\0") if "=" in v)
                    seen[int(proc.name)] = (argv, {k: env[k] for k in env if k.startswith("LEDGERBATCH_")})
            except (OSError, ProcessLookupError):
                continue
        stop.wait(0.3)


def test_a_run_with_known_secrets_leaves_none_in_logs_ledger_argv_or_lineage(tmp_path, engine, db_url, broker,
                                                                             secret_role):
    from ledgerbatch.dev.registry import DevRegistry

    name = f"secrets_{os.getpid()}"
    topic = f"t_{name}"
    broker.create_topic(topic, 2)
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    run_url = make_url(db_url).set(username=secret_role, password=DB_PW).render_as_string(hide_password=False)
    lineage = tmp_path / "lineage.jsonl"
    (tmp_path / "openlineage.yml").write_text(json.dumps(
        {"transport": {"type": "file", "log_file_path": str(lineage), "append": True}}))
    with DevRegistry(user_info=f"etl:{REG_PW}") as registry:
        _produce_avro(broker.bootstrap_servers, registry.url, topic, 40)
        # The spec names the deployment's registry with a user-info of its own: stored redacted, and the
        # deployment's credentials win there (docs/security.md).
        (pipelines / f"{name}.yaml").write_text(yaml.safe_dump({
            "name": name,
            "source": {"topics": [topic], "format": "avro", "schema": "order_id STRING, amount BIGINT",
                       "schema_registry": {"url": registry.url, "basic.auth.user.info": f"etl:{SPEC_PW}"}},
            "target": {"table": f"public.target_{name}"}}))
        env = {**os.environ, "LEDGERBATCH_DB_URL": run_url, "LEDGERBATCH_PIPELINES_DIR": str(pipelines),
               "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "LEDGERBATCH_SPARK_MASTER": "local[2]",
               "LEDGERBATCH_SCHEMA_REGISTRY": json.dumps({"url": registry.url,
                                                          "basic.auth.user.info": f"etl:{REG_PW}"}),
               "LEDGERBATCH_SPARK_LOG_LEVEL": "INFO",  # Spark's own log too: every property it prints
               "OPENLINEAGE_CONFIG": str(tmp_path / "openlineage.yml"), "LEDGERBATCH_DEBUG": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "ledgerbatch.cli", "run", name], env=env, cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        seen: dict = {}
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(proc.pid, seen, stop), daemon=True)
        watcher.start()
        try:
            out, err = proc.communicate(timeout=300)
        finally:
            stop.set()
            watcher.join()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]

    with engine.connect() as conn:
        assert conn.execute(text(f'SELECT count(*) FROM "public"."target_{name}"')).scalar() == 40  # it really ran
        tables = conn.execute(text("SELECT table_schema, table_name FROM information_schema.tables WHERE "
                                   "table_schema LIKE 'ledger%' AND table_type = 'BASE TABLE'")).all()
        ledger = "\n".join(str(conn.execute(text(f'SELECT coalesce(string_agg(t::text, E\'\\n\'), \'\') FROM '
                                                 f'"{schema}"."{table}" t')).scalar()) for schema, table in tables)
        spec_text = conn.execute(text("SELECT spec_text FROM ledger.spec_versions WHERE pipeline = :p"),
                                 {"p": name}).scalar()
    assert '"basic.auth.user.info": "<redacted>"' in spec_text
    jvm = [argv for argv, _ in seen.values() if "java" in argv.split(" ")[0]]
    assert jvm, "the run's Spark JVM was seen"
    leaks = (_leaks("stdout", out) + _leaks("stderr", err) + _leaks("ledger", ledger)
             + _leaks("lineage", lineage.read_text()) + [x for pid, (argv, _) in seen.items()
                                                         for x in _leaks(f"argv of {pid}", argv)])
    assert not leaks
    assert len(lineage.read_text().splitlines()) >= 2  # START and COMPLETE of the batch were written
    # Only the CLI's own process holds the variables it was given: the JVM and its Python workers do not.
    holders = {pid: sorted(found) for pid, (argv, found) in seen.items() if "LEDGERBATCH_DB_URL" in found
               or "LEDGERBATCH_SCHEMA_REGISTRY" in found}
    assert set(holders) == {proc.pid}, holders


@pytest.fixture
def submit_settings():
    from ledgerbatch.config import Settings

    return Settings(db_url=f"postgresql+psycopg2://etl:{DB_PW}@db.internal:5432/ledger", bootstrap_servers="k:9093",
                    pipelines_dir=Path("pipelines"), spark_master="",
                    kafka_options={"security.protocol": "SASL_SSL", "sasl.username": "etl", "sasl.password": KAFKA_PW},
                    schema_registry={"url": "https://registry", "basic.auth.user.info": f"etl:{REG_PW}"})


@pytest.mark.parametrize("master, mode", [("local[2]", None), ("spark://m:7077", "client"), ("yarn", "client"),
                                          ("yarn", "cluster"), ("k8s://https://api:6443", "client"),
                                          ("k8s://https://api:6443", "cluster")])
def test_the_process_tasks_spark_submit_carries_no_secret(master, mode, submit_settings, tmp_path, monkeypatch,
                                                          caplog):
    """The exact command SparkSubmitHook would exec, built by the operator's own prepare_submit; the secrets
    reach the job by a 0600 file (or, on a Kubernetes cluster, a secret named by reference)."""
    import airflow.providers.apache.spark.hooks.spark_submit as spark_submit

    from ledgerbatch.airflow.operators import ProcessBatchOperator
    from ledgerbatch.config import Settings
    from ledgerbatch.spark.settings_file import with_settings_file

    if master.startswith("k8s"):  # the hook only checks the cncf provider (not installed here) is importable
        monkeypatch.setattr(spark_submit, "kube_client", object(), raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": master, "extra": {"deploy-mode": mode} if mode else {}}))
    monkeypatch.setenv(STAGING_DB_URL, STAGER_URL)  # the worker's stager login, which the job must get too
    op = ProcessBatchOperator(task_id="process", pipeline="orders", pipelines_dir="pipelines", batch_id="42",
                              kubernetes_secret="ledgerbatch-secrets")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    op.prepare_submit(submit_settings, private)
    hook = op._get_hook()
    argv = hook._build_spark_submit_command(op.application)
    spark_env = hook._env or {}
    assert not _leaks("argv", " ".join(argv)) + _leaks("env", json.dumps(spark_env)) + _leaks("log", caplog.text)
    if master.startswith("k8s") and mode == "cluster":
        assert "spark.kubernetes.driver.secretKeyRef.LEDGERBATCH_DB_URL=ledgerbatch-secrets:db-url" in argv
        assert f"spark.kubernetes.driver.secretKeyRef.{STAGING_DB_URL}=ledgerbatch-secrets:staging-db-url" in argv
        assert "--settings-file" not in argv
        return
    path = Path(argv[argv.index("--settings-file") + 1])
    assert path.parent == private and path.stat().st_mode & 0o777 == 0o600
    assert ("--files" in argv and argv[argv.index("--files") + 1] == str(path)) == (mode == "cluster")
    monkeypatch.delenv(STAGING_DB_URL)  # a cluster driver does not inherit the worker's
    assert with_settings_file(Settings.from_env(), str(path)).db_url == submit_settings.db_url
    assert os.environ[STAGING_DB_URL] == STAGER_URL  # where staging reads it (config.staging_db_url)
    assert (spark_env.get("SPARK_LOCAL_IP") == "127.0.0.1") == master.startswith("local")


def test_a_reused_process_operator_ships_only_this_tries_settings_file(submit_settings, tmp_path, monkeypatch):
    """On a YARN cluster each try's --files holds the operator's own files and this try's settings file, not
    the last try's (its directory is gone)."""
    from ledgerbatch.airflow.operators import ProcessBatchOperator

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}))
    op = ProcessBatchOperator(task_id="process", pipeline="orders", pipelines_dir="pipelines", batch_id="42",
                              files="/etc/ledgerbatch/log4j2.properties")
    for attempt in (1, 2):
        private = tmp_path / f"try{attempt}"
        private.mkdir(mode=0o700)
        op.prepare_submit(submit_settings, private)
        argv = op._get_hook()._build_spark_submit_command(op.application)
        shipped = argv[argv.index("--files") + 1]
        assert shipped == f"/etc/ledgerbatch/log4j2.properties,{private}/ledgerbatch-settings.json"


def test_a_kubernetes_cluster_driver_without_a_secret_is_refused(submit_settings, tmp_path, monkeypatch):
    import airflow.providers.apache.spark.hooks.spark_submit as spark_submit
    from airflow.sdk.exceptions import AirflowFailException

    from ledgerbatch.airflow.operators import ProcessBatchOperator

    monkeypatch.setattr(spark_submit, "kube_client", object(), raising=False)
    monkeypatch.delenv("LEDGERBATCH_KUBERNETES_SECRET", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": "k8s://https://api:6443", "extra": {"deploy-mode": "cluster"}}))
    op = ProcessBatchOperator(task_id="process", pipeline="orders", pipelines_dir="pipelines", batch_id="42")
    with pytest.raises(AirflowFailException, match="Kubernetes secret"):
        op.prepare_submit(submit_settings, tmp_path)
    assert not list(tmp_path.iterdir())


def test_the_spark_submit_job_reads_its_settings_file_where_yarn_puts_it(submit_settings, tmp_path, monkeypatch):
    """A YARN cluster driver finds --files in its container's working directory, by the file's name."""
    from ledgerbatch.config import Settings
    from ledgerbatch.spark.settings_file import with_settings_file, write_settings_file

    path = write_settings_file(tmp_path, submit_settings)
    container = tmp_path / "container"
    container.mkdir()
    (container / path.name).write_text(path.read_text())
    monkeypatch.chdir(container)
    read = with_settings_file(Settings.from_env(), f"/gone/on/this/host/{path.name}")
    assert (read.db_url, read.kafka_options, read.schema_registry) == (
        submit_settings.db_url, submit_settings.kafka_options, submit_settings.schema_registry)


def test_a_specs_own_registry_credentials_are_redacted_and_left_out_of_its_version():
    from ledgerbatch.spec.pipeline import parse_spec
    from ledgerbatch.spec.resolve import registry_settings

    def spec(password: str):
        return parse_spec({"name": "orders", "source": {
            "topics": ["orders"], "format": "avro", "schema": "order_id STRING",
            "schema_registry": {"url": f"https://etl:{password}@registry.example:8081",
                                "basic.auth.user.info": f"etl:{password}", "bearer.auth.token": password}},
            "target": {"table": "public.orders"}})

    first, rotated = spec(SPEC_PW), spec(SPEC_PW + "-rotated")
    assert SPEC_PW not in first.canonical
    assert json.loads(first.canonical)["source"]["schema_registry"] == {
        "url": "https://<redacted>@registry.example:8081", "basic.auth.user.info": "<redacted>",
        "bearer.auth.token": "<redacted>"}
    assert first.version == rotated.version
    # The client still gets them: redaction is of what is stored, not of what is used.
    assert registry_settings(dict(first.format_options), {})["basic.auth.user.info"] == f"etl:{SPEC_PW}"


def test_a_registry_error_shows_its_url_without_user_info():
    from ledgerbatch.errors import ConfigError
    from ledgerbatch.processes import free_port
    from ledgerbatch.spec.pipeline import parse_spec
    from ledgerbatch.spec.resolve import resolve_columns

    spec = parse_spec({"name": "orders", "source": {
        "topics": ["orders"], "format": "avro",
        "schema_registry": {"url": f"http://etl:{SPEC_PW}@127.0.0.1:{free_port()}", "timeout": 2}},
        "target": {"table": "public.orders"}})
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        resolve_columns(spec)
    assert "<redacted>@127.0.0.1" in str(refused.value) and SPEC_PW not in str(refused.value)
    assert time.monotonic() - started < 60


def test_a_registry_password_with_an_at_sign_is_redacted_whole():
    """The registry client splits the user-info off at the authority's last '@'; so does the redaction."""
    from ledgerbatch.spec.pipeline import parse_spec
    from ledgerbatch.spec.secrets import without_userinfo

    url = f"http://etl:{SPEC_PW}@x@127.0.0.1:8081/path@v1?q=a@b"
    assert without_userinfo(url) == "http://<redacted>@127.0.0.1:8081/path@v1?q=a@b"
    spec = parse_spec({"name": "orders", "source": {
        "topics": ["orders"], "format": "avro", "schema": "order_id STRING", "schema_registry": {"url": url}},
        "target": {"table": "public.orders"}})
    assert SPEC_PW not in spec.canonical and "@x" not in spec.canonical


def test_spec_texts_stored_before_redaction_are_redacted_by_migrate_and_their_batches_still_run(engine):
    """What the ledger held before #51: texts with the registry password, under versions hashing it, and open
    batches pinned to them (one per password, rotated once). `migrate` redacts them, re-keys them and their
    batches under the version the spec has now, and a second migrate changes nothing."""
    from ledgerbatch.ledger.batches import get_batch, insert_batch, pin_spec_version
    from ledgerbatch.ledger.migrations import migrate
    from ledgerbatch.model.batch import BatchKind
    from ledgerbatch.model.ranges import OffsetRange
    from ledgerbatch.spec.pipeline import canonical_text, check_version, parse_spec, version_of

    name = f"sec_old_{os.getpid()}"

    def doc(password: str) -> dict:
        return {"name": name, "source": {
            "topics": ["orders"], "format": "avro", "schema": "order_id STRING",
            "schema_registry": {"url": f"https://etl:{password}@registry:8081",
                                "basic.auth.user.info": f"etl:{password}"}},
            "target": {"table": "public.orders"}}

    old_texts = [canonical_text(doc(pw), redact=False) for pw in (SPEC_PW, SPEC_PW + "-rotated")]  # as stored then
    batches = []
    with engine.begin() as conn:
        for i, old in enumerate(old_texts):
            batch_id = insert_batch(conn, name, BatchKind.BACKFILL, [OffsetRange("orders", i, 0, 10)])
            assert pin_spec_version(conn, batch_id, name, version_of(old), old) == version_of(old)
            batches.append(batch_id)
    spec = parse_spec(doc(SPEC_PW + "-rotated"))
    assert spec.version not in {version_of(t) for t in old_texts}

    migrate(engine)
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL ROLE ledgerbatch_inspector"))
        stored = conn.execute(text("SELECT version, spec_text FROM ledger.spec_versions WHERE pipeline = :p"),
                              {"p": name}).all()
    assert [v for v, _ in stored] == [spec.version] and stored[0][1] == spec.canonical
    assert not _leaks("spec_versions", stored[0][1])
    with engine.begin() as conn:  # what stage/process.py does before it stages a batch
        for batch_id in batches:
            check_version(spec, batch_id, pin_spec_version(conn, batch_id, name, spec.version, spec.canonical))
            assert get_batch(conn, batch_id).spec_version == spec.version

    with engine.begin() as conn:
        before = conn.execute(text("SELECT version, spec_text, first_seen FROM ledger.spec_versions "
                                   "WHERE pipeline = :p"), {"p": name}).all()
    migrate(engine)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT version, spec_text, first_seen FROM ledger.spec_versions "
                                 "WHERE pipeline = :p"), {"p": name}).all() == before
        for table in ("batch_ranges", "batches", "spec_versions"):
            conn.execute(text(f"DELETE FROM ledger.{table} WHERE pipeline = :p"), {"p": name})


def test_a_batch_planned_before_redaction_runs_under_the_unchanged_spec():
    """A batch pinned by the code before #51 after the upgrade's migrate (a worker not yet upgraded) still runs
    under the same spec file; one with another password's version does not."""
    from ledgerbatch.errors import SpecVersionError
    from ledgerbatch.spec.pipeline import canonical_text, check_version, parse_spec, version_of

    doc = {"name": "orders", "source": {"topics": ["orders"], "format": "avro", "schema": "order_id STRING",
                                        "schema_registry": {"url": "https://registry", "bearer.auth.token": SPEC_PW}},
           "target": {"table": "public.orders"}}
    spec = parse_spec(doc)
    check_version(spec, 1, version_of(canonical_text(doc, redact=False)))
    doc["source"]["schema_registry"]["bearer.auth.token"] = SPEC_PW + "-other"
    with pytest.raises(SpecVersionError):
        check_version(spec, 1, version_of(canonical_text(doc, redact=False)))
    assert parse_spec({**doc, "source": {"topics": ["orders"], "schema": "a STRING"}}).version_before_redaction is None


def test_migrate_leaves_a_stored_text_without_secrets_as_it_is():
    """Only a secret makes redacted_spec_text rewrite a text: not an older layout, nor upkeep keys."""
    from ledgerbatch.spec.pipeline import redacted_spec_text

    older = json.dumps({"name": "orders", "history": {"compact_after": "7d"},
                        "source": {"topics": ["orders"], "schema_registry": {"url": "https://registry"}}})
    assert redacted_spec_text(older) == older
    assert redacted_spec_text("PipelineSpec(name='orders', ...)") == "PipelineSpec(name='orders', ...)"


def test_the_demos_airflow_password_file_is_its_users_only(tmp_path, monkeypatch):
    """AirflowStandalone's home and passwords.json as it leaves them, up to where it starts Spark, under the
    usual umask 022."""
    from ledgerbatch.config import Settings
    from ledgerbatch.dev import airflow_demo

    class SparkStarts(Exception):
        pass

    def spark_starts(**_):
        raise SparkStarts

    monkeypatch.setattr(airflow_demo, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(airflow_demo, "LocalConnectServer", spark_starts)
    umask = os.umask(0o022)
    try:
        with pytest.raises(SparkStarts):
            airflow_demo.AirflowStandalone(Settings.from_env(), None, 18080)
    finally:
        os.umask(umask)
    home = tmp_path / ".tmp" / "airflow"
    assert (home.stat().st_mode & 0o777, (home / "passwords.json").stat().st_mode & 0o777) == (0o700, 0o600)
    assert json.loads((home / "passwords.json").read_text()) == {airflow_demo.USER: airflow_demo.PASSWORD}

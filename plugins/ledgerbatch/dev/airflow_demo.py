"""`ledgerbatch demo` with Airflow: `airflow standalone` in a throw-away home, wired to the demo's Kafka,
dev registry, database and a Spark Connect server through Airflow Connections; the scheduled demo DAG is
triggered until caught up, the event-driven one runs by itself, also for new records produced at the end."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from ledgerbatch.config import REPO_ROOT, Settings
from ledgerbatch.dev.demo import PIPELINES, DemoSetup, prepare, report
from ledgerbatch.errors import ConfigError
from ledgerbatch.ledger.cursors import get_cursors
from ledgerbatch.ledger.engine import fresh_database
from ledgerbatch.processes import stop_group
from ledgerbatch.spark.server import LocalConnectServer
from ledgerbatch.spec.pipeline import load_spec

# The UI's login: a password of this run's own (each `ledgerbatch demo` is a process), printed when Airflow is up.
USER, PASSWORD = "admin", secrets.token_urlsafe(12)
NEW_ORDERS = 100  # produced once the pipelines are caught up: the event-driven orders DAG runs by itself


def airflow_env(setup: DemoSetup, home: Path, metadata_url: str, port: int) -> dict[str, str]:
    u = make_url(setup.db_url)
    # The UI and REST API on loopback (Airflow's default: every interface) unless the environment says so.
    api_host = os.environ.get("AIRFLOW__API__HOST") or "127.0.0.1"
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": api_host,
        # Task runners reach the API server here; the default assumes port 8080.
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL":
            f"http://{'127.0.0.1' if api_host in ('0.0.0.0', '::') else api_host}:{port}/execution/",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
        "LEDGERBATCH_PIPELINES_DIR": str(REPO_ROOT / "pipelines"),
        "AIRFLOW_CONN_LEDGERBATCH_DB": json.dumps({"conn_type": "postgres", "host": u.host, "port": u.port,
                                                   "login": u.username, "password": u.password, "schema": u.database}),
        "AIRFLOW_CONN_LEDGERBATCH_KAFKA": json.dumps({"conn_type": "generic",
                                                      "extra": {"bootstrap.servers": setup.broker.bootstrap_servers}}),
        "AIRFLOW_CONN_LEDGERBATCH_SCHEMA_REGISTRY": json.dumps({"conn_type": "http", "host": setup.registry.url}),
        # Airflow 3 creates no default connections; without spark_default SparkSubmitHook falls back to yarn.
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    }


def _airflow(env: dict, *args: str, timeout: float = 120) -> str:
    done = subprocess.run([str(Path(sys.executable).parent / "airflow"), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode:
        raise ConfigError(f"airflow {' '.join(args)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


def _wait(what: str, check, timeout: float, every: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every)
    raise ConfigError(f"gave up waiting for {what} after {timeout:.0f}s")


def _dag_id(pipeline: str) -> str:
    return f"ledgerbatch_{pipeline}"


def _dags_listed(env: dict) -> bool:
    try:
        listed = _airflow(env, "dags", "list")
    except ConfigError:  # still migrating its database
        return False
    return all(_dag_id(p) in listed for p in PIPELINES)


def _runs(env: dict, dag_id: str) -> list[dict]:
    """A demo DAG's runs (the CLI prints log lines before its JSON)."""
    out = _airflow(env, "dags", "list-runs", dag_id, "-o", "json")
    for line in reversed(out.splitlines()):
        if line.startswith("["):
            return json.loads(line)
    return []


def _lag(setup: DemoSetup, pipeline: str) -> int:
    """Offsets of the pipeline's topic (named as the pipeline) not yet delivered."""
    from ledgerbatch.source.kafka import watermarks

    ends = watermarks(setup.broker.bootstrap_servers, (pipeline,))
    with setup.engine.connect() as conn:
        done = get_cursors(conn, pipeline)
    return sum(wm.high - done.get(tp, 0) for tp, wm in ends.items())


class AirflowStandalone:
    """`airflow standalone` in a throw-away home (`.tmp/airflow`), wired to the demo's broker, registry and
    database, with a Spark Connect server (the wheel's, a child) that its process tasks run on, warm."""

    def __init__(self, settings: Settings, setup: DemoSetup, port: int):
        self.setup = setup
        self.home = REPO_ROOT / ".tmp" / "airflow"
        shutil.rmtree(self.home, ignore_errors=True)
        # The UI's admin password is for this run's user only: a 0700 home, a 0600 file, whatever the umask.
        self.home.mkdir(parents=True, mode=0o700)
        self.home.chmod(0o700)
        with os.fdopen(os.open(self.home / "passwords.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(json.dumps({USER: PASSWORD}))
        self.log_path = self.home / "standalone.log"
        self.event_driven = {p for p in PIPELINES if load_spec(settings.pipelines_dir, p).event_driven}
        self.reported: set[str] = set()
        self.proc = None
        started = time.monotonic()
        self.spark = LocalConnectServer(output=(self.home / "spark-connect.log").open("w"))
        try:
            print(f"Spark Connect server: {self.spark.url} (the process tasks run there; log "
                  f"{self.home / 'spark-connect.log'}), up in {time.monotonic() - started:.0f}s", flush=True)
            self.env = airflow_env(setup, self.home, fresh_database(settings.db_url, "ledgerbatch_airflow"), port)
            self.env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = json.dumps(
                {"conn_type": "spark_connect", "host": "127.0.0.1", "port": self.spark.port})
            print(f"starting Airflow (standalone, home {self.home}, log {self.log_path}) ...", flush=True)
            self.proc = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "standalone"], env=self.env,
                                         stdout=self.log_path.open("w"), stderr=subprocess.STDOUT,
                                         start_new_session=True)
            _wait("Airflow to start and parse the DAGs", lambda: _dags_listed(self.env), 300)
        except BaseException:
            self.close()
            raise

    def catch_up(self) -> None:
        """Until every pipeline is caught up: scheduled pipelines get runs triggered, event-driven ones start
        their own (their watcher sees the offsets the ledger has not delivered)."""
        pending = set(PIPELINES)
        deadline = time.monotonic() + 1800
        while pending:
            if time.monotonic() > deadline:
                raise ConfigError(f"{', '.join(sorted(pending))} not caught up after 30 minutes: see {self.log_path}")
            for pipeline in sorted(pending):
                runs = self.report_runs(pipeline)
                if not any(r["state"] in ("queued", "running") for r in runs):
                    if _lag(self.setup, pipeline) == 0:
                        pending.discard(pipeline)
                        print(f"\n{_dag_id(pipeline)}: caught up\n", flush=True)
                    elif pipeline not in self.event_driven:
                        _airflow(self.env, "dags", "trigger", _dag_id(pipeline))
                        print(f"triggered {_dag_id(pipeline)}", flush=True)
            time.sleep(5)

    def report_runs(self, pipeline: str) -> list[dict]:
        """The pipeline's DAG runs; prints each newly finished one, raises on a failed one."""
        runs = _runs(self.env, _dag_id(pipeline))
        for run in runs:
            if run["state"] in ("success", "failed") and run["run_id"] not in self.reported:
                self.reported.add(run["run_id"])
                print(f"{_dag_id(pipeline)} run {run['run_id']}: {run['state']}", flush=True)
                if run["state"] == "failed":
                    raise ConfigError(f"DAG run {run['run_id']} failed: see the UI or {self.log_path}")
        return runs

    def delivered_in(self, pipeline: str, offsets: int, timeout: float = 300) -> float:
        """Seconds from now until the ledger's cursors cover the first `offsets` offsets of the pipeline's topic
        (they move only in a commit): one query every 0.2 s, nothing that loads the broker."""
        started = time.monotonic()
        while True:
            with self.setup.engine.connect() as conn:
                if sum(get_cursors(conn, pipeline).values()) >= offsets:
                    return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise ConfigError(f"{pipeline}: not delivered {timeout:.0f}s after producing: see {self.log_path}")
            if self.proc.poll() is not None:
                raise ConfigError(f"airflow standalone exited with {self.proc.returncode}: see {self.log_path}")
            time.sleep(0.2)

    def newest_run(self, pipeline: str, timeout: float = 300) -> dict:
        """The pipeline's most recently started DAG run, once it has finished (raises if it failed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = self.report_runs(pipeline)
            newest = max(runs, key=lambda r: r.get("start_date") or "", default=None)
            if newest is not None and newest["state"] in ("success", "failed"):
                return newest
            time.sleep(1)
        raise ConfigError(f"{_dag_id(pipeline)}: no finished run within {timeout:.0f}s: see {self.log_path}")

    def close(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, 30)
        self.spark.close()


def run_with_airflow(settings: Settings, records: int, partitions: int, port: int) -> None:
    setup = prepare(settings, records, partitions)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below on SIGTERM too
    airflow = None
    try:
        airflow = AirflowStandalone(settings, setup, port)
        airflow.catch_up()
        if "orders" in airflow.event_driven:  # new records start a run by themselves
            setup.produce_more_orders(NEW_ORDERS)
            print(f"produced {NEW_ORDERS} more orders; nobody triggers ledgerbatch_orders ...", flush=True)
            seconds = airflow.delivered_in("orders", setup.records)
            run = airflow.newest_run("orders")
            print(f"ledgerbatch_orders: its watcher started run {run['run_id']}; produced to committed in "
                  f"{seconds:.1f}s\n", flush=True)
        report(setup)
        print(f"\nAirflow UI: http://127.0.0.1:{port}  (user {USER}, password {PASSWORD}, this run's own)")
        print("DAGs: ledgerbatch_orders (event-driven: runs when new orders arrive), ledgerbatch_payments (every 15 "
              "minutes), ledgerbatch_backfill (a form: replay or backfill a range), ledgerbatch_offsets (a form: move "
              "a pipeline's cursors) and ledgerbatch_history (daily upkeep; a form: compact or purge by hand). The "
              "backfill and offsets forms start as a dry run. Batches run on the Spark Connect server. Kafka, the dev "
              "registry, Spark and Airflow stay up until Ctrl-C.", flush=True)
        airflow.proc.wait()
    finally:
        if airflow is not None:
            airflow.close()
        setup.close()

"""`ledgerbatch demo` with Airflow: `airflow standalone` in a throw-away home, wired to the demo's
dev broker, dev registry and database through Airflow Connections, the demo DAGs triggered until caught up."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from .. import ledger
from ..config import REPO_ROOT, Settings
from ..db import fresh_database
from ..demo import PIPELINES, DemoSetup, prepare, report
from ..errors import ConfigError
from ..processes import stop_group

USER, PASSWORD = "admin", "ledgerbatch"


def airflow_env(setup: DemoSetup, home: Path, metadata_url: str, port: int) -> dict[str, str]:
    u = make_url(setup.db_url)
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
        # Task runners reach the API server here; the default assumes port 8080.
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{port}/execution/",
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
    from ..kafka import watermarks

    ends = watermarks(setup.broker.bootstrap_servers, (pipeline,))
    with setup.engine.connect() as conn:
        done = ledger.cursors(conn, pipeline)
    return sum(wm.high - done.get(tp, 0) for tp, wm in ends.items())


def run_with_airflow(settings: Settings, records: int, partitions: int, port: int) -> None:
    setup = prepare(settings, records, partitions)
    home = REPO_ROOT / ".tmp" / "airflow"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    (home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
    metadata_url = fresh_database(settings.db_url, "ledgerbatch_airflow")
    env = airflow_env(setup, home, metadata_url, port)
    log_path = home / "standalone.log"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below on SIGTERM too
    print(f"starting Airflow (standalone, home {home}, log {log_path}) ...", flush=True)
    standalone = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "standalone"], env=env,
                                  stdout=log_path.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait("Airflow to start and parse the DAGs", lambda: _dags_listed(env), 300)
        # Scheduled runs start on their own; trigger more until every pipeline is caught up.
        reported: set[str] = set()
        pending = set(PIPELINES)
        while pending:
            for pipeline in sorted(pending):
                runs = _runs(env, _dag_id(pipeline))
                for run in runs:
                    if run["state"] in ("success", "failed") and run["run_id"] not in reported:
                        reported.add(run["run_id"])
                        print(f"{_dag_id(pipeline)} run {run['run_id']}: {run['state']}", flush=True)
                        if run["state"] == "failed":
                            raise ConfigError(f"DAG run {run['run_id']} failed: see the UI or {log_path}")
                if not any(r["state"] in ("queued", "running") for r in runs):
                    if _lag(setup, pipeline) == 0:
                        pending.discard(pipeline)
                        print(f"\n{_dag_id(pipeline)}: caught up\n", flush=True)
                        continue
                    _airflow(env, "dags", "trigger", _dag_id(pipeline))
                    print(f"triggered {_dag_id(pipeline)}", flush=True)
            time.sleep(5)
        report(setup)
        print(f"\nAirflow UI: http://localhost:{port}  (user {USER}, password {PASSWORD})")
        print("DAGs: ledgerbatch_orders and ledgerbatch_payments (every 15 minutes) and ledgerbatch_backfill "
              "(trigger it with a form to replay or backfill a range). The dev broker, the dev registry and Airflow "
              "stay up until Ctrl-C.", flush=True)
        standalone.wait()
    finally:
        stop_group(standalone, 30)
        setup.close()

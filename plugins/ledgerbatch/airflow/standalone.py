"""`ledgerbatch demo` with Airflow: `airflow standalone` in a throw-away home, wired to the demo's
dev broker and database through Airflow Connections, the demo DAG triggered until caught up."""
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
from ..demo import PIPELINE, DemoSetup, prepare, report
from ..errors import ConfigError

DAG_ID = "ledgerbatch_orders"
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
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
        "LEDGERBATCH_PIPELINES_DIR": str(REPO_ROOT / "pipelines"),
        "AIRFLOW_CONN_LEDGERBATCH_DB": json.dumps({"conn_type": "postgres", "host": u.host, "port": u.port,
                                                   "login": u.username, "password": u.password, "schema": u.database}),
        "AIRFLOW_CONN_LEDGERBATCH_KAFKA": json.dumps({"conn_type": "generic",
                                                      "extra": {"bootstrap.servers": setup.broker.bootstrap_servers}}),
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


def _dag_listed(env: dict) -> bool:
    try:
        return DAG_ID in _airflow(env, "dags", "list")
    except ConfigError:  # still migrating its database
        return False


def _runs(env: dict) -> list[dict]:
    """The demo DAG's runs (the CLI prints log lines before its JSON)."""
    out = _airflow(env, "dags", "list-runs", DAG_ID, "-o", "json")
    for line in reversed(out.splitlines()):
        if line.startswith("["):
            return json.loads(line)
    return []


def _lag(setup: DemoSetup) -> int:
    from ..kafka import watermarks

    ends = watermarks(setup.broker.bootstrap_servers, ("orders",))
    with setup.engine.connect() as conn:
        done = ledger.cursors(conn, PIPELINE)
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
        _wait("Airflow to start and parse the DAGs", lambda: _dag_listed(env), 300)
        # Scheduled runs start on their own; trigger more until the pipeline is caught up.
        reported: set[str] = set()
        while True:
            runs = _runs(env)
            for run in runs:
                if run["state"] in ("success", "failed") and run["run_id"] not in reported:
                    reported.add(run["run_id"])
                    print(f"DAG run {run['run_id']}: {run['state']}", flush=True)
                    if run["state"] == "failed":
                        raise ConfigError(f"DAG run {run['run_id']} failed: see the UI or {log_path}")
            if not any(r["state"] in ("queued", "running") for r in runs):
                if _lag(setup) == 0:
                    break
                _airflow(env, "dags", "trigger", DAG_ID)
                print(f"triggered {DAG_ID}", flush=True)
            time.sleep(5)
        print(f"\n{DAG_ID}: caught up after {len(reported)} DAG runs\n")
        report(setup)
        print(f"\nAirflow UI: http://localhost:{port}  (user {USER}, password {PASSWORD})")
        print("DAGs: ledgerbatch_orders (every 15 minutes) and ledgerbatch_backfill (trigger it with a form "
              "to replay or backfill a range). The dev broker and Airflow stay up until Ctrl-C.", flush=True)
        standalone.wait()
    finally:
        if standalone.poll() is None:
            os.killpg(standalone.pid, signal.SIGTERM)
            try:
                standalone.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(standalone.pid, signal.SIGKILL)
        setup.broker.close()

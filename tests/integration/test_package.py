"""The wheel as a team installs it: built with `python -m build`, installed into a fresh venv with only the
runtime extras (beside a plain apache-airflow and the Spark provider), used from outside the repo: the CLI,
the provider's connection types, the migrations it carries, and a DAG file in another dags folder."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from .helpers import REPO

pytestmark = pytest.mark.integration

DAG_FILE = '''from pathlib import Path

from ledgerbatch.airflow.factory import build_dags

globals().update(build_dags(Path(__file__).parent / "pipelines"))
'''
SPEC = """name: orders
source: {topics: [orders], format: json, schema: "order_id STRING, amount DECIMAL(12,2)"}
target: {table: public.orders_from_wheel}
"""


def test_the_wheel_installs_into_a_clean_venv_and_works_outside_the_repo(tmp_path, db_url):
    source = tmp_path / "source"  # what the wheel is made of, copied: no build/ left over from another build
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("plugins", "sql", "spark_jobs"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("ledgerbatch-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    install = [str(venv / "bin" / "pip"), "install", "-q", "-c", str(REPO / "requirements.txt"), f"{wheel}[airflow,metrics]"]
    done = subprocess.run(install, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"WHEEL {wheel.name} {wheel.stat().st_size} bytes; installed with: pip install '{wheel.name}[airflow,metrics]'")

    work = tmp_path / "elsewhere"
    (work / "dags" / "pipelines").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "LEDGERBATCH_PIPELINES_DIR",
                                                            "LEDGERBATCH_SQL_DIR")}
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", AIRFLOW_HOME=str(tmp_path / "airflow"), LEDGERBATCH_DB_URL=db_url,
               AIRFLOW__CORE__LOAD_EXAMPLES="False")

    def run(*args: str) -> str:
        out = subprocess.run(list(args), capture_output=True, text=True, cwd=work, env=env, timeout=600)
        assert out.returncode == 0, (args, out.stdout[-2000:], out.stderr[-3000:])
        return out.stdout

    assert "Exactly-once Kafka -> PostgreSQL batches" in run("ledgerbatch", "--help")
    location = run(str(venv / "bin" / "python"), "-c", "import ledgerbatch; print(ledgerbatch.__file__)")
    assert location.startswith(str(venv)), location  # the wheel's, not the repo's
    assert "ledgerbatch" in run("airflow", "providers", "list")
    hooks = run("airflow", "providers", "hooks")
    for conn_type, hook in (("ledgerbatch_ledger", "LedgerHook"), ("ledgerbatch_kafka", "KafkaConfigHook"),
                            ("ledgerbatch_schema_registry", "SchemaRegistryHook")):
        assert any(line.split("|")[0].strip() == conn_type and f"ledgerbatch.airflow.hooks.{hook}" in line
                   for line in hooks.splitlines()), hooks
    fresh = make_url(db_url).set(database=f"wheel_{os.getpid()}")
    admin = create_engine(db_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{fresh.database}"'))
        conn.execute(text(f'CREATE DATABASE "{fresh.database}"'))
    try:  # the migrations it carries, applied to an empty database
        env["LEDGERBATCH_DB_URL"] = fresh.render_as_string(hide_password=False)
        assert "applied migrations [1, 2, 3" in run("ledgerbatch", "migrate")
    finally:
        env["LEDGERBATCH_DB_URL"] = db_url
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{fresh.database}" WITH (FORCE)'))

    (work / "dags" / "ledgerbatch_dags.py").write_text(DAG_FILE)
    (work / "dags" / "pipelines" / "orders.yaml").write_text(SPEC)
    parsed = run(str(venv / "bin" / "python"), "-c", (
        "from airflow.dag_processing.dagbag import DagBag\n"
        "bag = DagBag(dag_folder='dags')\n"
        "assert not bag.import_errors, bag.import_errors\n"
        "print('DAGS', sorted(bag.dag_ids))\n"
        "print('APP', bag.dags['ledgerbatch_orders'].get_task('process').application)\n"))
    lines = dict(line.split(" ", 1) for line in parsed.splitlines() if line.startswith(("DAGS ", "APP ")))
    dag_ids, application = lines["DAGS"], lines["APP"]
    assert dag_ids == "['ledgerbatch_backfill', 'ledgerbatch_history', 'ledgerbatch_offsets', 'ledgerbatch_orders']"
    assert application.startswith(str(venv)) and application.endswith("ledgerbatch/_spark_jobs/process_batch.py")
    assert Path(application).is_file()

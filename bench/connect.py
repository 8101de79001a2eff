"""Spark Connect figures (#13): the pipeline DAG (`dag.test()`) with its process task on a warm Spark Connect
server, against the cold spark-submit path and the 2-process floor (bench/floor.py) on the same data.

    python -m bench.connect [--records 1000000] [--partitions 32] [--runs 3] [--small-repeats 5]

- small: a 100-record DAG run, trigger (dag.test() called) to committed (the commit task's end), median of
  `--small-repeats` runs, on the warm Connect server and through cold spark-submit (`spark_default` local[*]);
- large: `--records` in one batch through the pipeline DAG on the warm server and through cold spark-submit,
  against the floor on the same topic, medians of `--runs` (interleaved per run: floor, Connect, spark-submit);
  every Connect run is the same pipeline, whose kept session an unmeasured 1,000-record batch warmed first;
- `--paths`: the same large batch through the DAG on the warm server for the per-minute aggregate, the filter
  and the Avro append too (bench/transforms.py, bench/avro.py; results checked as bench.paths checks them),
  one more pipeline each, warmed the same way, run in turn after the JSON DAG in every run.

Its databases are prefixed `lb_connect_bench_` (not the main bench's `lb_bench_`) and dropped at the end;
the broker and the Connect server are its children and stopped at the end. Prints one JSON document.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("LEDGERBATCH_BENCH_DB_PREFIX", "lb_connect_bench_")
AIRFLOW_HOME = tempfile.mkdtemp(prefix="lb_connect_bench_airflow_")
REPO = Path(__file__).resolve().parents[1]
os.environ.update({  # before anything imports Airflow: a throw-away home, this repo's dags/ and plugins/
    "AIRFLOW_HOME": AIRFLOW_HOME,
    "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME}/airflow.db",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
})

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from . import floor  # noqa: E402
from ledgerbatch.dev.registry import DevRegistry  # noqa: E402
from ledgerbatch.spark.server import LocalConnectServer  # noqa: E402

from . import transforms  # noqa: E402
from .avro import AvroOrders  # noqa: E402
from .common import BIN, BROKERS, DB_PREFIX, SERVER_URL, BrokerProcess, check_retained, count_rows, fresh_database  # noqa: E402
from .lb import write_spec  # noqa: E402

TOPIC, SMALL_TOPIC, AVRO_TOPIC = "connect_orders", "connect_small", "connect_avro"
# --paths beyond the JSON DAG: (topic, spec extra, with the registry)
PATHS = {"aggregate": (TOPIC, transforms.AGGREGATE, False), "filter": (TOPIC, transforms.FILTER, False),
         "avro": (AVRO_TOPIC, None, True)}


def connections(db_url: str, bootstrap: str, remote: str | None) -> None:
    """The DAG's connections as AIRFLOW_CONN_* variables; `remote` None: spark-submit (spark_default local[*])."""
    u = make_url(db_url)
    os.environ["AIRFLOW_CONN_LEDGERBATCH_DB"] = json.dumps(
        {"conn_type": "postgres", "host": u.host, "port": u.port, "login": u.username, "password": u.password,
         "schema": u.database})
    os.environ["AIRFLOW_CONN_LEDGERBATCH_KAFKA"] = json.dumps({"conn_type": "generic",
                                                               "extra": {"bootstrap.servers": bootstrap}})
    os.environ["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps({"conn_type": "spark", "host": "local[*]"})
    os.environ.pop("LEDGERBATCH_SPARK_REMOTE", None)
    if remote:
        host, port = remote.removeprefix("sc://").split(":")
        os.environ["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = json.dumps(
            {"conn_type": "spark_connect", "host": host, "port": int(port)})
    else:
        os.environ.pop("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", None)


def ledger_db(name: str) -> str:
    from ledgerbatch.ledger.engine import make_engine
    from ledgerbatch.ledger.migrations import migrate

    url = fresh_database(name)
    engine = make_engine(url)
    migrate(engine)
    engine.dispose()
    return url


def dag_run(pipelines_dir: Path, name: str) -> dict:
    """One dag.test() of `ledgerbatch_<name>`: trigger to committed (the commit task's end) and to the run's end."""
    from ledgerbatch.airflow.factory import build_dags

    os.environ["LEDGERBATCH_PIPELINES_DIR"] = str(pipelines_dir)  # dag.test() re-parses dags/
    dag = build_dags(pipelines_dir)[f"ledgerbatch_{name}"]
    triggered = datetime.now(timezone.utc)
    started = time.monotonic()
    run = dag.test()
    wall = time.monotonic() - started
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    if str(run.state) != "success" or str(tis["commit"].state) != "success":
        raise RuntimeError(f"{name}: DAG run {run.state}: { {k: str(t.state) for k, t in tis.items()} }")
    return {"committed_s": (tis["commit"].end_date - triggered).total_seconds(), "wall_s": wall,
            "process_s": (tis["process"].end_date - tis["process"].start_date).total_seconds()}


def small_runs(bootstrap: str, workdir: Path, remote: str | None, repeats: int, records: int, label: str) -> list[dict]:
    """`repeats` DAG runs of `records` new orders each into one pipeline (after one unmeasured warm-up run)."""
    from ledgerbatch.dev.demodata import produce_orders

    name = f"connect_small_{label}"
    url = ledger_db(f"{DB_PREFIX}{label}")
    connections(url, bootstrap, remote)
    pipelines_dir = workdir / label
    write_spec(pipelines_dir, name, SMALL_TOPIC, records)
    # Unmeasured warm-up run first; then every measured run is one batch of at most `records` (max_records).
    produce_orders(bootstrap, SMALL_TOPIC, records, 4, start=0)
    dag_run(pipelines_dir, name)
    runs = []
    for i in range(repeats):
        produce_orders(bootstrap, SMALL_TOPIC, records, 4, start=(i + 1) * records)
        runs.append(dag_run(pipelines_dir, name))
        print(f"  {label} run {i + 1}: {runs[-1]}", flush=True)
    return runs


def large_runs(bootstrap: str, workdir: Path, remote: str, runs: int, records: int, partitions: int,
               cold: bool, paths: list[str], registry_url: str | None) -> dict:
    """Per run, on the same topic: the floor, the DAG on the warm server, (`cold`) the DAG through spark-submit,
    then each of `paths` through the DAG on the warm server."""
    floors, dags, colds = [], [], []
    by_path: dict[str, list[dict]] = {path: [] for path in paths}
    # One pipeline per path, as a scheduled one runs again and again: its kept Connect session is warm from an
    # unmeasured first batch (of 1,000 records); each run below starts on a fresh ledger all the same.
    for name, topic, extra, avro in [("connect_large", TOPIC, None, False)] + [
            (f"{path}_large", *PATHS[path]) for path in paths]:
        connections(ledger_db(f"{DB_PREFIX}large_{name}"), bootstrap, remote)
        write_spec(workdir / "large", name, topic, 1000, registry_url if avro else None, extra)
        dag_run(workdir / "large", name)
    check = _checks(records, paths)
    for i in range(runs):
        floors.append(floor.run(bootstrap, TOPIC, partitions, f"{DB_PREFIX}floor"))
        if floors[-1]["rows"] != records:
            raise RuntimeError(f"floor delivered {floors[-1]['rows']} of {records}")
        print(f"  floor run {i + 1}: {floors[-1]['wall_s']:.2f}s", flush=True)
        for path, into, server in (("connect", dags, remote), ("cold", colds, None))[:2 if cold else 1]:
            name = f"{path}_large"
            url = ledger_db(f"{DB_PREFIX}large_{path}")
            connections(url, bootstrap, server)
            write_spec(workdir / "large", name, TOPIC, records)
            into.append(dag_run(workdir / "large", name))
            rows = count_rows(url, f"public.{name}")
            if rows != records:
                raise RuntimeError(f"the {path} DAG delivered {rows} of {records}")
            print(f"  {path} DAG run {i + 1}: {into[-1]}", flush=True)
        for path in paths:
            name, (topic, extra, avro) = f"{path}_large", PATHS[path]
            url = ledger_db(f"{DB_PREFIX}large_{path}")
            connections(url, bootstrap, remote)
            write_spec(workdir / "large", name, topic, records, registry_url if avro else None, extra)
            by_path[path].append(dag_run(workdir / "large", name))
            check[path](url, f"public.{name}")
            print(f"  {path} DAG run {i + 1}: {by_path[path][-1]}", flush=True)
    return {"floor": floors, "dag": dags, "cold": colds, "paths": by_path}


def _checks(records: int, paths: list[str]) -> dict:
    """Path -> check(url, table): raises unless the path's target holds what its records make."""
    def rows(url: str, table: str, want: int, what: str) -> None:
        got = count_rows(url, table)
        if got != want:
            raise RuntimeError(f"the {what} DAG delivered {got} rows of {want}")

    def aggregate(url: str, table: str) -> None:
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                got = {(r.customer, r.minute): (r.orders, r.revenue, r.smallest, r.largest) for r in conn.execute(
                    text(f"SELECT customer, minute, orders, revenue, smallest, largest FROM {table}"))}
        finally:
            engine.dispose()
        if got != groups:
            raise RuntimeError("the aggregate DAG's totals differ from those of the produced values")

    groups = transforms.expected_groups(records) if "aggregate" in paths else None
    kept = transforms.expected_filtered_rows(records) if "filter" in paths else None
    return {"aggregate": aggregate, "filter": lambda url, table: rows(url, table, kept, "filter"),
            "avro": lambda url, table: rows(url, table, records, "Avro")}


def median(runs: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 3)


def drop_databases() -> None:
    admin = create_engine(SERVER_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        names = conn.execute(text("SELECT datname FROM pg_database WHERE datname LIKE :p"), {"p": DB_PREFIX + "%"}).scalars()
        for name in list(names):
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3, help="large-batch runs (floor and DAG each)")
    parser.add_argument("--small-records", type=int, default=100)
    parser.add_argument("--small-repeats", type=int, default=5)
    parser.add_argument("--broker", choices=sorted(BROKERS), default="kafka")
    parser.add_argument("--skip-cold", action="store_true", help="no cold spark-submit runs")
    parser.add_argument("--skip-large", action="store_true", help="no large-batch runs")
    parser.add_argument("--paths", type=lambda v: v.split(","), default=[],
                        help=f"large batches of these paths on the warm server too, comma-separated, of {', '.join(PATHS)}")
    args = parser.parse_args(argv)
    if set(args.paths) - set(PATHS):
        parser.error(f"unknown paths: {', '.join(sorted(set(args.paths) - set(PATHS)))}")
    done = subprocess.run([str(BIN / "airflow"), "db", "migrate"], capture_output=True, text=True, env=os.environ)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    workdir = Path(tempfile.mkdtemp(prefix="lb_connect_bench_"))
    load_at_start = os.getloadavg()[0]
    broker = BrokerProcess({TOPIC: args.partitions, SMALL_TOPIC: 4, AVRO_TOPIC: args.partitions}, args.broker)
    registry = DevRegistry()
    server = None
    try:
        print(f"{broker.kind} broker {broker.bootstrap}: producing {args.records:,} orders into {args.partitions} partitions", flush=True)
        from ledgerbatch.dev.demodata import produce_orders

        produce_orders(broker.bootstrap, TOPIC, args.records, args.partitions)
        check_retained(broker.bootstrap, TOPIC, args.records)
        if "avro" in args.paths:
            AvroOrders(broker.bootstrap, registry, AVRO_TOPIC, args.records, args.partitions)
            check_retained(broker.bootstrap, AVRO_TOPIC, args.records)
        started = time.monotonic()
        server = LocalConnectServer(output=subprocess.DEVNULL)
        print(f"Spark Connect server {server.url} up in {time.monotonic() - started:.1f}s", flush=True)
        results: dict = {"load_at_start": round(load_at_start, 2)}
        print("small: warm Spark Connect", flush=True)
        connect_small = small_runs(broker.bootstrap, workdir, server.url, args.small_repeats, args.small_records, "connect")
        results["small_connect"] = {"committed_s": median(connect_small, "committed_s"),
                                    "wall_s": median(connect_small, "wall_s"), "runs": connect_small}
        if not args.skip_cold:
            print("small: cold spark-submit", flush=True)
            cold_small = small_runs(broker.bootstrap, workdir, None, args.small_repeats, args.small_records, "cold")
            results["small_cold"] = {"committed_s": median(cold_small, "committed_s"),
                                     "wall_s": median(cold_small, "wall_s"), "runs": cold_small}
        if not args.skip_large:
            print(f"large: {args.records:,} records, the floor and the DAG (warm server, cold spark-submit)", flush=True)
            large = large_runs(broker.bootstrap, workdir, server.url, args.runs, args.records, args.partitions,
                               not args.skip_cold, args.paths, registry.url)
            results["large"] = {"floor_s": median(large["floor"], "wall_s"), "dag_committed_s": median(large["dag"], "committed_s"),
                                "dag_wall_s": median(large["dag"], "wall_s"), "dag_process_s": median(large["dag"], "process_s"),
                                "runs": large}
            results["large"]["ratio_committed"] = round(results["large"]["dag_committed_s"] / results["large"]["floor_s"], 2)
            results["large"]["ratio_per_run"] = [round(d["committed_s"] / f["wall_s"], 2)
                                                 for d, f in zip(large["dag"], large["floor"])]
            for path, runs in large["paths"].items():
                results["large"][f"{path}_committed_s"] = median(runs, "committed_s")
                results["large"][f"{path}_ratio_committed"] = round(
                    results["large"][f"{path}_committed_s"] / results["large"]["floor_s"], 2)
            if large["cold"]:
                results["large"]["cold_committed_s"] = median(large["cold"], "committed_s")
                results["large"]["cold_ratio_committed"] = round(results["large"]["cold_committed_s"] / results["large"]["floor_s"], 2)
        results["load_at_end"] = round(os.getloadavg()[0], 2)
        results["command"] = "python -m bench.connect " + " ".join(sys.argv[1:] if argv is None else argv)
    finally:
        if server:
            server.close()
        registry.stop()
        broker.close()
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(AIRFLOW_HOME, ignore_errors=True)
        drop_databases()
    print(json.dumps(results, indent=2, default=str))
    return results


if __name__ == "__main__":
    main()

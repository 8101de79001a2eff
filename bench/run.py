"""The benchmark driver (issue #5): floor, peer and ledgerbatch on the same data (ledgerbatch warm on it as JSON
and as Avro too, issue #10), then latency, scaling with the ledger, and the aggregate at growing sizes.

    python -m bench.run [--records N] [--partitions P] [--runs R] [--historic N1,N2,...] [--sizes N1,N2,...]
                        [--broker kafka|mock] [--out DIR] [--docs DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from ledgerbatch.dev.demodata import produce_orders
from ledgerbatch.dev.registry import DevRegistry

from . import floor, lb, plot, report, sizes, transforms
from .avro import AvroOrders
from .common import BROKERS, DB_PREFIX, REPO, SERVER_URL, BrokerProcess, check_retained, child_env, median_run
from .latency import Latency
from .peer import Peer

TOPIC, AVRO_TOPIC, LATENCY_TOPIC = "bench", "bench_avro", "latency"


def _ints(value: str) -> list[int]:
    return [int(v) for v in value.split(",") if v]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--partitions", type=int, default=32)
    p.add_argument("--runs", type=int, default=3, help="runs per contender; figures are medians")
    p.add_argument("--historic", type=_ints, default=[1_000, 100_000, 1_000_000],
                   help="historic batch counts for the scaling figure (comma-separated)")
    p.add_argument("--latency-repeats", type=int, default=3)
    p.add_argument("--scaling-repeats", type=int, default=7, help="timed plan+commit batches per historic size")
    p.add_argument("--sizes", type=_ints, default=[],
                   help="more batch sizes for the aggregate beside the floor, one run each (comma-separated)")
    p.add_argument("--broker", choices=sorted(BROKERS), default="kafka",
                   help="a real Apache Kafka 2.3 (default) or librdkafka's mock cluster, which serves from memory")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="where the JSON results go")
    p.add_argument("--docs", type=Path, default=REPO / "docs", help="where benchmarks.md and benchmarks.png go")
    return p.parse_args(argv)


def contenders(bootstrap: str, args, workdir: Path, peer: Peer, avro: AvroOrders) -> dict:
    runs: dict[str, list[dict]] = {k: [] for k in ("floor", "peer", "ledgerbatch_one", "ledgerbatch_warm",
                                                   "ledgerbatch_avro_warm", "ledgerbatch_aggregate_warm",
                                                   "ledgerbatch_filter_warm", "ledgerbatch_several",
                                                   "ledgerbatch_small_batch")}
    small = max(1, args.records // 10)
    groups, kept = transforms.expected_groups(args.records), transforms.expected_filtered_rows(args.records)
    want = {"ledgerbatch_small_batch": small, "ledgerbatch_aggregate_warm": len(groups), "ledgerbatch_filter_warm": kept}
    for i in range(args.runs):
        print(f"run {i + 1}/{args.runs}: floor", flush=True)
        runs["floor"].append(floor.run(bootstrap, TOPIC, args.partitions, f"{DB_PREFIX}floor"))
        print(f"run {i + 1}/{args.runs}: peer", flush=True)
        runs["peer"].append(peer.run(f"{DB_PREFIX}peer"))
        print(f"run {i + 1}/{args.runs}: ledgerbatch", flush=True)
        runs["ledgerbatch_one"].append(lb.run(bootstrap, TOPIC, f"{DB_PREFIX}one", workdir, args.records)
                                       | {"batch_records": args.records})
        runs["ledgerbatch_warm"].append(lb.run_warm(bootstrap, TOPIC, f"{DB_PREFIX}warm", workdir, args.records))
        runs["ledgerbatch_avro_warm"].append(avro.run_warm(f"{DB_PREFIX}avro", workdir, args.records))
        runs["ledgerbatch_aggregate_warm"].append(
            transforms.run_aggregate_warm(bootstrap, TOPIC, f"{DB_PREFIX}aggregate", workdir, args.records, groups))
        runs["ledgerbatch_filter_warm"].append(
            transforms.run_filter_warm(bootstrap, TOPIC, f"{DB_PREFIX}filter", workdir, args.records))
        runs["ledgerbatch_several"].append(lb.run(bootstrap, TOPIC, f"{DB_PREFIX}several", workdir, -(-args.records // 4)))
        runs["ledgerbatch_small_batch"].append(lb.run(bootstrap, TOPIC, f"{DB_PREFIX}small", workdir, small, max_batches=1)
                                               | {"batch_records": small})
        for key, results in runs.items():
            got = results[-1]["rows"]
            print(f"  {key}: {results[-1]['wall_s']:.2f} s, {got:,} rows", flush=True)
            if got != want.get(key, args.records) and key != "peer":  # the peer is at-least-once: its count is reported
                raise SystemExit(f"{key}: {got} rows, expected {want.get(key, args.records)}")
            if results[-1].get("totals_equal") is False:
                raise SystemExit(f"{key}: the aggregate's totals differ from the totals of the produced records")
    return {k: median_run(v) for k, v in runs.items()}


def scaling(bootstrap: str, args, workdir: Path) -> list[dict]:
    cfg = {"bootstrap": bootstrap, "topic": TOPIC, "partitions": args.partitions, "workdir": str(workdir / "scaling"),
           "repeats": args.scaling_repeats, "historic": args.historic}
    done = subprocess.run([sys.executable, "-m", "bench.scaling", json.dumps(cfg)], env=child_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=7200)
    if done.returncode:
        raise SystemExit(f"scaling failed:\n{done.stderr[-3000:]}")
    return json.loads(next(line.split(" ", 1)[1] for line in done.stdout.splitlines()
                           if line.startswith("BENCH_SCALING_RESULT ")))


def drop_databases() -> None:
    admin = create_engine(make_url(SERVER_URL).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        names = conn.execute(text("SELECT datname FROM pg_database WHERE datname LIKE :p"), {"p": DB_PREFIX + "%"}).scalars()
        for name in [n for n in names if n != f"{DB_PREFIX}test"]:  # lb_bench_test may be a running pytest's
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    command = "python -m bench.run " + shlex.join(sys.argv[1:] if argv is None else argv)
    load_at_start = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="lb_bench_"))
    topics = {TOPIC: args.partitions, AVRO_TOPIC: args.partitions, LATENCY_TOPIC: 4}
    broker = BrokerProcess(topics | {sizes.topic(n): args.partitions for n in args.sizes}, args.broker)
    registry = DevRegistry()
    try:
        print(f"{broker.kind} broker {broker.bootstrap}: producing {args.records:,} orders into {args.partitions} partitions", flush=True)
        produce_orders(broker.bootstrap, TOPIC, args.records, args.partitions)
        check_retained(broker.bootstrap, TOPIC, args.records)
        print(f"dev registry {registry.url}: the same orders as Avro into {AVRO_TOPIC}", flush=True)
        avro = AvroOrders(broker.bootstrap, registry, AVRO_TOPIC, args.records, args.partitions)
        check_retained(broker.bootstrap, AVRO_TOPIC, args.records)
        peer = Peer(broker.bootstrap, TOPIC, args.records)
        try:
            results = {"started": started, "contenders": contenders(broker.bootstrap, args, workdir, peer, avro)}
        finally:
            peer.close()
        results["registry"] = avro.registry_figures()
        print("latency: cold, then warm", flush=True)
        latency = Latency(broker.bootstrap, LATENCY_TOPIC, 4, workdir)
        results["latency"] = {"cold": latency.cold(args.latency_repeats), "warm": latency.warm(args.latency_repeats)}
        print(f"scaling: {args.historic} historic batches", flush=True)
        results["scaling"] = scaling(broker.bootstrap, args, workdir)
        results["sizes"] = sizes.aggregate_at_sizes(broker.bootstrap, args.sizes, args.partitions, workdir)
    finally:
        registry.stop()
        broker.close()
        shutil.rmtree(workdir, ignore_errors=True)
        drop_databases()
    results["config"] = {"broker": args.broker, "records": args.records, "partitions": args.partitions, "runs": args.runs,
                         "historic": args.historic, "latency_repeats": args.latency_repeats,
                         "scaling_repeats": args.scaling_repeats, "sizes": args.sizes, "command": command}
    # Other work on these shared cores skews every figure: the load shows how much there was.
    results["machine"] = report.machine() | {"load_1min": [round(load_at_start, 2), round(os.getloadavg()[0], 2)]}
    results["targets"] = report.targets(results)
    json_path = report.write_json(results, args.out)
    args.docs.mkdir(parents=True, exist_ok=True)
    plot.plot(results, args.docs / "benchmarks.png")
    report.write_doc(results, args.docs / "benchmarks.md", "benchmarks.png")
    print("\n" + report.tables(results))
    print(f"\nresults: {json_path}\nreport: {args.docs / 'benchmarks.md'}, {args.docs / 'benchmarks.png'}")
    return results


if __name__ == "__main__":
    main()

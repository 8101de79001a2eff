"""The transform and Avro paths beside the floor, one run on the same data (issue #25): the floor, the warm
JSON append, the warm per-minute aggregate (totals checked against the produced values), the warm filter
and the warm Avro append (the same orders as Avro values through the dev registry).

    python -m bench.paths [--records N] [--partitions P] [--runs R] [--broker kafka|mock] [--paths a,b] [--steady]

Prints each contender's median wall, its ratio to the floor's and its time a record; writes nothing.
Each run runs every chosen contender once, in turn. A contender's batch is the first of a fresh
`run --follow` (Spark and its Python workers started, nothing else run yet); with --steady it is the
second, on topics that hold the same records twice over: a follower that has run the pipeline's batches
before, as a long-running one has. The full report with
every contender is bench.run (`make bench`).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from ledgerbatch.dev.demodata import produce_orders
from ledgerbatch.dev.registry import DevRegistry

from . import floor, lb, transforms
from .avro import AvroOrders
from .common import BROKERS, DB_PREFIX, BrokerProcess, check_retained
from .run import AVRO_TOPIC, drop_databases

TOPIC, TWICE = "bench", "bench_twice"


PATHS = ("floor", "json append", "aggregate", "filter", "avro append")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.paths", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--partitions", type=int, default=32)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--broker", choices=sorted(BROKERS), default="kafka")
    p.add_argument("--paths", type=lambda v: v.split(","), default=list(PATHS),
                   help=f"comma-separated, of {', '.join(PATHS)} (the floor always runs); default all")
    p.add_argument("--steady", action="store_true", help="time each contender's second batch of the same records")
    args = p.parse_args()
    unknown = set(args.paths) - set(PATHS)
    if unknown:
        p.error(f"unknown paths: {', '.join(sorted(unknown))}")
    workdir = Path(tempfile.mkdtemp(prefix="lb_paths_"))
    broker = BrokerProcess({TOPIC: args.partitions, TWICE: args.partitions, AVRO_TOPIC: args.partitions}, args.broker)
    registry = DevRegistry()
    walls: dict[str, list[float]] = {k: [] for k in PATHS if k == "floor" or k in args.paths}
    try:
        produce_orders(broker.bootstrap, TOPIC, args.records, args.partitions)
        check_retained(broker.bootstrap, TOPIC, args.records)
        if args.steady:  # the same orders twice over: the contenders' second batch equals the floor's data
            for _ in range(2):
                produce_orders(broker.bootstrap, TWICE, args.records, args.partitions)
            check_retained(broker.bootstrap, TWICE, 2 * args.records)
        run = _contenders(broker.bootstrap, registry, workdir, args)
        for i in range(args.runs):
            for key in walls:
                walls[key].append(run[key]())
            print(f"run {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in walls.items()), flush=True)
    finally:
        registry.stop()
        broker.close()
        shutil.rmtree(workdir, ignore_errors=True)
        drop_databases()
    base = statistics.median(walls["floor"])
    batch = "each contender's second batch (--steady)" if args.steady else "each contender's first batch"
    print(f"\n{args.records:,} records, {args.partitions} partitions, {args.broker} broker, {batch}, medians of {args.runs}:")
    for key, values in walls.items():
        print(f"  {key}: {statistics.median(values):.2f} s ({', '.join(f'{v:.2f}' for v in values)}), "
              f"{statistics.median(values) / base:.2f}x the floor, {statistics.median(values) / args.records * 1e6:.2f} us a record")
    if {"avro append", "json append"} <= set(walls):
        print(f"  avro append / json append: "
              f"{statistics.median(walls['avro append']) / statistics.median(walls['json append']):.2f}x")


def _contenders(bootstrap: str, registry: DevRegistry, workdir: Path, args) -> dict:
    """Path -> a function that runs it once, checks its result and returns its wall seconds."""
    records = args.records
    copies = 2 if args.steady else 1  # the records each topic holds, and the batches of a contender
    topic = TWICE if args.steady else TOPIC

    def checked(result: dict, ok: bool, what: str) -> float:
        if not ok:
            raise SystemExit(f"wrong result: {what}")
        return result["wall_s"]

    def aggregate() -> float:
        result = transforms.run_aggregate_warm(bootstrap, topic, f"{DB_PREFIX}aggregate", workdir, records, groups,
                                               copies)
        return checked(result, result["totals_equal"], "the aggregate's totals differ from the produced values'")

    def filtered() -> float:
        result = transforms.run_filter_warm(bootstrap, topic, f"{DB_PREFIX}filter", workdir, records, copies)
        return checked(result, result["rows"] == kept, f"the filter kept {result['rows']} rows of {kept}")

    def warm() -> float:
        result = lb.run_warm(bootstrap, topic, f"{DB_PREFIX}warm", workdir, records, batches=copies)
        return checked(result, result["rows"] == records * copies, f"JSON append wrote {result['rows']} rows")

    def avro_warm() -> float:
        result = avro.run_warm(f"{DB_PREFIX}avro", workdir, records, copies)
        return checked(result, result["rows"] == records * copies, f"Avro append wrote {result['rows']} rows")

    groups = _times(transforms.expected_groups(records), copies) if "aggregate" in args.paths else None
    kept = transforms.expected_filtered_rows(records) * copies if "filter" in args.paths else None
    avro = None
    if "avro append" in args.paths:
        avro = AvroOrders(bootstrap, registry, AVRO_TOPIC, records, args.partitions, copies)
        check_retained(bootstrap, AVRO_TOPIC, records * copies)
    return {"floor": lambda: floor.run(bootstrap, TOPIC, args.partitions, f"{DB_PREFIX}floor")["wall_s"],
            "json append": warm, "aggregate": aggregate, "filter": filtered, "avro append": avro_warm}


def _times(groups: dict, copies: int) -> dict:
    """The aggregate's groups over `copies` copies of the same records: counts and sums multiply."""
    return {key: (n * copies, revenue * copies, low, high) for key, (n, revenue, low, high) in groups.items()}


if __name__ == "__main__":
    main()

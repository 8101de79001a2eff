"""The transform paths beside the floor, one run on the same data (issue #25): the floor, the warm JSON append,
the warm per-minute aggregate (totals checked against the produced values) and the warm filter.

    python -m bench.paths [--records N] [--partitions P] [--runs R] [--broker kafka|mock]

Prints each contender's median wall and its ratio to the floor's; writes nothing. The full report with
every contender is bench.run (`make bench`).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from ledgerbatch.dev.demodata import produce_orders

from . import floor, lb, transforms
from .common import BROKERS, DB_PREFIX, BrokerProcess, check_retained
from .run import drop_databases

TOPIC = "bench"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.paths", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--partitions", type=int, default=32)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--broker", choices=sorted(BROKERS), default="kafka")
    args = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="lb_paths_"))
    broker = BrokerProcess({TOPIC: args.partitions}, args.broker)
    walls: dict[str, list[float]] = {"floor": [], "json append": [], "aggregate": [], "filter": []}
    try:
        produce_orders(broker.bootstrap, TOPIC, args.records, args.partitions)
        check_retained(broker.bootstrap, TOPIC, args.records)
        groups, kept = transforms.expected_groups(args.records), transforms.expected_filtered_rows(args.records)
        for i in range(args.runs):
            walls["floor"].append(floor.run(broker.bootstrap, TOPIC, args.partitions, f"{DB_PREFIX}floor")["wall_s"])
            warm = lb.run_warm(broker.bootstrap, TOPIC, f"{DB_PREFIX}warm", workdir, args.records)
            aggregate = transforms.run_aggregate_warm(broker.bootstrap, TOPIC, f"{DB_PREFIX}aggregate", workdir,
                                                      args.records, groups)
            filtered = transforms.run_filter_warm(broker.bootstrap, TOPIC, f"{DB_PREFIX}filter", workdir, args.records)
            if not aggregate["totals_equal"] or filtered["rows"] != kept or warm["rows"] != args.records:
                raise SystemExit(f"wrong result: aggregate totals equal {aggregate['totals_equal']}, filter rows "
                                 f"{filtered['rows']} of {kept}, append rows {warm['rows']} of {args.records}")
            for key, result in (("json append", warm), ("aggregate", aggregate), ("filter", filtered)):
                walls[key].append(result["wall_s"])
            print(f"run {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in walls.items()), flush=True)
    finally:
        broker.close()
        shutil.rmtree(workdir, ignore_errors=True)
        drop_databases()
    base = statistics.median(walls["floor"])
    print(f"\n{args.records:,} records, {args.partitions} partitions, {args.broker} broker, medians of {args.runs}:")
    for key, values in walls.items():
        print(f"  {key}: {statistics.median(values):.2f} s ({', '.join(f'{v:.2f}' for v in values)}), "
              f"{statistics.median(values) / base:.2f}x the floor")


if __name__ == "__main__":
    main()

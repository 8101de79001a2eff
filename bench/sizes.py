"""The aggregate batch at growing sizes (issue #25's scaling row): for each size, a topic of that many orders,
the floor on it and one warm aggregate batch of all of them (the first of a fresh `run --follow`, as the main
contenders'), one run each; the aggregate's totals are checked against the produced values'."""
from __future__ import annotations

from pathlib import Path

from ledgerbatch.dev.demodata import produce_orders

from . import floor, transforms
from .common import DB_PREFIX, check_retained


def topic(records: int) -> str:
    return f"bench_size_{records}"


def aggregate_at_sizes(bootstrap: str, sizes: list[int], partitions: int, workdir: Path) -> list[dict]:
    out = []
    for records in sizes:
        print(f"sizes: {records:,} orders, the floor and one aggregate batch", flush=True)
        produce_orders(bootstrap, topic(records), records, partitions)
        check_retained(bootstrap, topic(records), records)
        floor_s = floor.run(bootstrap, topic(records), partitions, f"{DB_PREFIX}size_floor")["wall_s"]
        result = transforms.run_aggregate_warm(bootstrap, topic(records), f"{DB_PREFIX}size_aggregate", workdir,
                                               records, transforms.expected_groups(records))
        if not result["totals_equal"]:
            raise SystemExit(f"the aggregate of {records:,} orders differs from the produced values' totals")
        out.append({"records": records, "floor_s": floor_s, "aggregate_s": result["wall_s"],
                    "phase_s": result["phase_s"], "totals_equal": True})
    return out

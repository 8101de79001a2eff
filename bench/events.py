"""Event-driven latency (#13): new records produced -> committed, with nobody triggering the DAG.

    python -m bench.events [--waves 5] [--records 100]

What `ledgerbatch demo` runs, measured: the demo's data (small), `airflow standalone` (scheduler, triggerer,
LocalExecutor, each task its own process) with the event-driven `orders` pipeline (`schedule: on_new_data`,
pipelines/orders.yaml) and its process tasks on a warm Spark Connect server. Once caught up, `--waves` times:
produce `--records` orders, then time until the ledger's cursors cover them (they move only in a commit). It
uses the demo's databases and `.tmp/airflow`, so not beside a running demo. Prints one JSON document.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys

from ledgerbatch.dev.airflow_demo import AirflowStandalone
from ledgerbatch.config import Settings
from ledgerbatch.processes import free_port
from ledgerbatch.dev.demo import prepare

from .common import count_rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waves", type=int, default=5)
    parser.add_argument("--records", type=int, default=100)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop Airflow and Spark below on SIGTERM too
    settings = Settings.from_env()
    load_at_start = os.getloadavg()[0]
    setup = prepare(settings, 2000, 4)
    airflow = None
    try:
        airflow = AirflowStandalone(settings, setup, free_port())
        if "orders" not in airflow.event_driven:
            raise SystemExit("pipelines/orders.yaml is not event-driven (schedule: on_new_data)")
        airflow.catch_up()
        seconds = []
        for wave in range(args.waves):
            setup.produce_more_orders(args.records)
            seconds.append(round(airflow.delivered_in("orders", setup.records), 2))
            print(f"wave {wave + 1}: {args.records} records produced -> committed in {seconds[-1]:.2f}s", flush=True)
        rows = count_rows(setup.db_url, "public.orders")
        if rows != setup.expected["orders"][0]:
            raise RuntimeError(f"orders: {rows} rows for {setup.expected['orders'][0]} valid records")
        result = {"records_per_wave": args.records, "median_s": statistics.median(seconds), "runs_s": seconds,
                  "rows_equal_valid_records": True, "load_at_start": round(load_at_start, 2),
                  "load_at_end": round(os.getloadavg()[0], 2),
                  "command": "python -m bench.events " + " ".join(argv if argv is not None else [])}
    finally:
        if airflow is not None:
            airflow.close()
        setup.close()
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])

"""Where one staging task's time goes, per path (issue #25): the same orders in ONE partition, one batch per
path on a warm `local[1]` session (so one staging task does all the work), with Spark's Python profilers on
(`spark.sql.pyspark.udf.profiler`, `spark.sql.pyspark.dataSource.profiler`).

    python -m bench.profile [--records N] [--broker kafka|mock]

Prints, per path, the batch's process phase (staging, wall), the Python workers' time in reading Kafka,
parsing and the COPY (cumulative seconds of read_messages, Parser.parse and the COPYs in the profiles)
and all their profiled Python time. A query pipeline's task runs two Python workers at once beside the
JVM (one parses, one COPYs the query's output), so its Python time can pass the wall. cProfile adds a
cost to every call it traces, more to paths of many small calls. Every path runs once unmeasured first
(Python worker, the query's code generation). Writes nothing.
"""
from __future__ import annotations

import argparse
import os
import pstats
import shutil
import tempfile
import time
from pathlib import Path

from ledgerbatch.dev.demodata import produce_orders
from ledgerbatch.dev.registry import DevRegistry

from . import lb, transforms
from .avro import AvroOrders
from .common import BROKERS, BrokerProcess, check_retained
from .run import AVRO_TOPIC, TOPIC, drop_databases

# What each column of the profile sums: the cumulative seconds of (file name, function name) of the package's
# code (the profiles hold file names without their directories), added (+1) or taken away (-1). A COPY pulls
# its rows as it sends them (csv_copy.copy_stream), so what pulling them costs (reading and parsing, or the
# query's output) is taken out of the COPY.
PHASES = {"read": {("reader.py", "_records"): 1}, "parse": {("parse.py", "parse"): 1},
          "copy": {("csv_copy.py", "copy_stream"): 1, ("csv_copy.py", "good_rows"): -1, ("tasks.py", "parts"): -1}}
PATHS = {"json append": (TOPIC, False, None), "avro append": (AVRO_TOPIC, True, None),
         "aggregate": (TOPIC, False, transforms.AGGREGATE), "filter": (TOPIC, False, transforms.FILTER)}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--broker", choices=sorted(BROKERS), default="kafka")
    args = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="lb_profile_"))
    broker = BrokerProcess({TOPIC: 1, AVRO_TOPIC: 1}, args.broker)
    registry = DevRegistry()
    try:
        produce_orders(broker.bootstrap, TOPIC, args.records, 1)
        check_retained(broker.bootstrap, TOPIC, args.records)
        AvroOrders(broker.bootstrap, registry, AVRO_TOPIC, args.records, 1)
        spark = _spark()
        print(f"{args.records:,} orders in one partition, one staging task (local[1]), warm; seconds:")
        print(f"{'path':<12} {'process':>8} {'read':>6} {'parse':>6} {'copy':>6} {'python':>7}")
        for name, (topic, avro, extra) in PATHS.items():
            for measured in (False, True):
                spark.profile.clear()
                wall = _one_batch(spark, broker.bootstrap, topic, registry.url if avro else None, extra, workdir,
                                  args.records)
            seconds, python = _profiled(spark, workdir / "profile")
            print(f"{name:<12} {wall:8.2f} {seconds['read']:6.2f} {seconds['parse']:6.2f} {seconds['copy']:6.2f} "
                  f"{python:7.2f}", flush=True)
    finally:
        registry.stop()
        broker.close()
        shutil.rmtree(workdir, ignore_errors=True)
        drop_databases()


def _spark():
    from ledgerbatch.spark.session import get_spark

    spark = get_spark("local[1]", "ledgerbatch-profile")
    spark.conf.set("spark.sql.pyspark.udf.profiler", "perf")
    spark.conf.set("spark.sql.pyspark.dataSource.profiler", "perf")
    return spark


def _one_batch(spark, bootstrap: str, topic: str, registry_url: str | None, extra: dict | None, workdir: Path,
               records: int) -> float:
    """One batch of every record on a fresh ledger; returns its process phase in seconds."""
    from ledgerbatch.config import Settings
    from ledgerbatch.ledger.engine import make_engine
    from ledgerbatch.plan.live import plan_next
    from ledgerbatch.spec.resolve import load_pipeline
    from ledgerbatch.stage.process import process_batch

    db_name = "lb_bench_profile"
    url, _, env = lb._prepare(bootstrap, topic, db_name, workdir, records, registry_url, extra)
    os.environ.update({k: env[k] for k in ("LEDGERBATCH_DB_URL", "KAFKA_BOOTSTRAP_SERVERS", "LEDGERBATCH_PIPELINES_DIR")})
    spec = load_pipeline(Settings.from_env(), lb.NAME)
    engine = make_engine(url)
    try:
        batch = plan_next(engine, spec, bootstrap)
        started = time.monotonic()
        process_batch(spark, engine, spec, batch.batch_id, url, bootstrap)
        return time.monotonic() - started
    finally:
        engine.dispose()


def _profiled(spark, directory: Path) -> tuple[dict[str, float], float]:
    """Cumulative seconds of each phase's functions over every profile the session holds, and all the
    Python time the profiles hold."""
    shutil.rmtree(directory, ignore_errors=True)
    spark.profile.dump(str(directory))
    stats = pstats.Stats(*sorted(map(str, directory.glob("*.pstats"))))
    out = {}
    for phase, functions in PHASES.items():
        out[phase] = sum(entry[3] * functions.get((Path(path).name, func), 0)
                         for (path, _, func), entry in stats.stats.items())
    return out, stats.total_tt


if __name__ == "__main__":
    main()

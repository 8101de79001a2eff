"""History soak (#42): months of small batches in an hour, with compaction and bounded partitions on.

    python -m bench.soak [--batches 10000] [--base-records 1000000] [--compact-after 20] [--sample-every 10]
                         [--max-minutes M] [--docs docs]

One append pipeline (every batch attached as a partition of its own: the worst case for the partition count,
`target.partitions: {attach_min_rows: 1}`, at most 16) and one upsert pipeline (1,000 keys) follow a trickle
of orders on real Apache Kafka, each through `ledgerbatch run --follow` as users run it, with
`history.compact_after` and `errors.quarantine_retention` of `--compact-after` seconds and upkeep every
`--compact-after / 2` seconds: each `--compact-after` stands for a month. The append target starts from what
months left it (`--base-records` orders in the topic before the followers start, delivered by the append
pipeline's first batches, one per partition the bound allows, and attached as partitions like any other), so
that what the data costs a query is nearly the same at the first thousand batches as at the last and what
grows is the history. Every `--sample-every` seconds the harness samples, per pipeline: the target lookup by
source coordinates and the `count(*) WHERE customer = ...` (wall and planning time), the ledger's size in
bytes and rows, the target's partitions and `verify`'s time; the followers' `phase` lines give plan and commit
time per batch. `verify` is timed whole and for its ledger part alone: its target part reads every target row,
so it grows with the data (the append target's rows), not with the history. Where the server runs without
autovacuum, the harness does its work before each sample with autovacuum's thresholds: it vacuums and analyzes
the target tables (partitions) that changed enough, and vacuums the system catalogs (compaction vacuums the
ledger itself). It stops once each pipeline has committed `--batches`, checks exactly once (every produced
record a row or quarantined, `verify` clean) and reports each series' first and last thousand batches
(medians). Prints one JSON document; with --docs, writes soak.png there (with --out, every sample in
soak.json). Its database is prefixed `lb_soak_` and dropped at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("LEDGERBATCH_BENCH_DB_PREFIX", "lb_soak_")

import yaml  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from .common import BIN, DB_PREFIX, REPO, SERVER_URL, BrokerProcess, child_env, fresh_database  # noqa: E402
from .lb import migrate, phases  # noqa: E402
from ledgerbatch.commit.modes.partitions import MAX_PARTITIONS  # noqa: E402
from ledgerbatch.dev.demodata import order, produce_orders  # noqa: E402
from ledgerbatch.ledger.inspection import violations  # noqa: E402
from ledgerbatch.ops.verify import verify  # noqa: E402
from ledgerbatch.spec.pipeline import load_spec  # noqa: E402

# The system catalogs a partition's creation and drop leave dead rows in.
CATALOGS = ", ".join(f"pg_catalog.{t}" for t in ("pg_class", "pg_attribute", "pg_depend", "pg_type", "pg_index",
                                                 "pg_inherits", "pg_constraint", "pg_attrdef", "pg_statistic"))
PIPELINES = {"soak_append": {"mode": "append", "partitions": {"attach_min_rows": 1}},
             "soak_upsert": {"mode": "upsert", "key": ["order_id"]}}
KEYS = 1000  # the upsert pipeline's distinct orders
POISON_EVERY = 499  # one record in this many is not JSON: quarantined, then purged (prime to KEYS)
LEDGER_TABLES = ("batches", "batch_ranges", "quarantine", "checkpoints", "compactions", "staged_reads", "cursors",
                 "end_offsets")


def write_specs(directory: Path, compact_after: float, base: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, target in PIPELINES.items():
        doc = {"name": name,
               "source": {"topics": [name], "format": "json",
                          "schema": "order_id STRING, customer STRING, amount DECIMAL(12,2), ts TIMESTAMP"},
               "target": {"table": f"public.{name}", **target},
               # The base arrives in as many big batches as the target keeps partitions: it starts as months
               # leave it, every partition full, not a few big ones beside a dozen nearly empty.
               "batch": {"max_records": max(200, -(-base // MAX_PARTITIONS)) if name == "soak_append" else 200},
               "errors": {"policy": "quarantine", "max_ratio": 0.5, "quarantine_retention": f"{compact_after:g}s"},
               "history": {"compact_after": f"{compact_after:g}s"}}
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


class Trickle(threading.Thread):
    """`rate` records a second into each pipeline's topic until stopped; counts what was acknowledged."""

    def __init__(self, bootstrap: str, rate: float, partitions: int):
        super().__init__(daemon=True)
        self.partitions = partitions
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3})
        self.rate, self.stop, self.sent = rate, threading.Event(), {name: 0 for name in PIPELINES}
        self.keys = set()  # upsert keys given a good record

    def run(self) -> None:
        i, tick = 0, 0.05
        while not self.stop.is_set():
            for _ in range(max(1, round(self.rate * tick))):
                for name in PIPELINES:
                    n = i % KEYS if name == "soak_upsert" else i
                    bad = i % POISON_EVERY == POISON_EVERY - 1
                    self.producer.produce(name, value=b"{oops" if bad else order(n), partition=i % self.partitions)
                    self.sent[name] += 1
                    if name == "soak_upsert" and not bad:
                        self.keys.add(n)
                i += 1
            self.producer.poll(0)
            self.stop.wait(tick)
        assert self.producer.flush(60) == 0
        self.producer = None  # gone before the broker is: no reconnect noise


def autovacuum_work(conn) -> None:
    """What autovacuum would do now with its default thresholds: VACUUM where dead rows passed 50 + 20% of
    the table, ANALYZE where changes passed 50 + 10% (leaf tables only, as autovacuum never analyzes a
    partitioned parent); and the system catalogs, which every attach and merge adds rows to and drops them from."""
    due = conn.execute(text(
        "SELECT format('%I.%I', s.schemaname, s.relname), n_dead_tup > 50 + 0.2 * c.reltuples, "
        "       n_mod_since_analyze > 50 + 0.1 * greatest(c.reltuples, 0) "
        "FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
        "WHERE s.schemaname = 'public' AND (s.relname LIKE 'soak\\_%' OR c.relispartition)")).all()
    for table, dead, changed in due:
        if dead or changed:
            conn.execute(text(f"VACUUM {'(ANALYZE) ' if changed else ''}{table}"))
    conn.execute(text(f"VACUUM (ANALYZE) {CATALOGS}"))


def timed(f, *args) -> float:
    started = time.monotonic()
    f(*args)
    return time.monotonic() - started


def timed_plan(conn, sql: str, **params) -> tuple[float, float]:
    """(wall ms, planning ms) of one query, from EXPLAIN ANALYZE."""
    plan = conn.execute(text(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}"), params).scalar_one()[0]
    return plan["Planning Time"] + plan["Execution Time"], plan["Planning Time"]


def sample(engine, specs: dict, started: float, autovacuum: bool) -> dict:
    out = {"t_s": round(time.monotonic() - started, 1)}
    # Autocommit: a transaction held across the samples would keep the target from the followers' commits.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if not autovacuum:  # this machine's server runs without it: do its work, as it would
            autovacuum_work(conn)
        sizes = conn.execute(text(" UNION ALL ".join(
            f"SELECT '{t}', pg_total_relation_size('ledger.{t}'), (SELECT count(*) FROM ledger.{t})"
            for t in LEDGER_TABLES))).all()
        out["ledger_bytes"] = sum(r[1] for r in sizes)
        out["ledger_rows"] = sum(r[2] for r in sizes)
        for name in PIPELINES:
            done = conn.execute(text(
                "SELECT (SELECT count(*) FROM ledger.batches WHERE pipeline = :p AND status = 'committed') "
                "+ coalesce((SELECT batches FROM ledger.compactions WHERE pipeline = :p), 0)"), {"p": name}).scalar_one()
            top = conn.execute(text(f"SELECT coalesce(max(_offset), 0) FROM public.{name} WHERE _partition = 0")).scalar()
            lookups = [timed_plan(conn, f"SELECT * FROM public.{name} WHERE _topic = :t AND _partition = 0 "
                                        f"AND _offset = :o", t=name, o=random.randint(0, top or 0)) for _ in range(5)]
            counts = [timed_plan(conn, f"SELECT count(*) FROM public.{name} WHERE customer = :c",
                                 c=f"c-{random.randrange(9973):04d}") for _ in range(5)]
            partitions = conn.execute(text("SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass(:t)"),
                                      {"t": f"public.{name}"}).scalar_one()
            ledger_s = statistics.median(timed(violations, conn, name) for _ in range(5))  # what history costs verify
            verify_started = time.monotonic()
            problems = verify(engine, specs[name])
            out[name] = {"batches": done, "partitions": partitions,
                         "lookup_ms": statistics.median(w for w, _ in lookups),
                         "lookup_planning_ms": statistics.median(p for _, p in lookups),
                         "count_ms": statistics.median(w for w, _ in counts),
                         "count_planning_ms": statistics.median(p for _, p in counts),
                         "verify_s": round(time.monotonic() - verify_started, 4), "violations": len(problems),
                         "verify_ledger_s": round(ledger_s, 5),
                         "target_rows": conn.execute(text(f"SELECT count(*) FROM public.{name}")).scalar_one()}
    return out


def first_and_last(samples: list[dict], per_batch: dict, window: int) -> dict:
    """Each series' median over each pipeline's first `window` batches and over its last `window`, and their
    ratio."""
    out = {}
    for name in PIPELINES:
        series = {}
        steps = per_batch[name]
        if len(steps) >= 2 * window:
            series["plan_commit_s"] = (steps[:window], steps[-window:])
        early = [s for s in samples if s[name]["batches"] <= window]
        late = [s for s in samples if s[name]["batches"] >= samples[-1][name]["batches"] - window]
        for key in ("lookup_ms", "lookup_planning_ms", "count_ms", "count_planning_ms", "verify_s", "verify_ledger_s",
                    "target_rows", "partitions"):
            series[key] = ([s[name][key] for s in early], [s[name][key] for s in late])
        for key in ("ledger_bytes", "ledger_rows"):
            series[key] = ([s[key] for s in early], [s[key] for s in late])
        out[name] = {}
        for key, (a, b) in series.items():
            if a and b:
                first, last = statistics.median(a), statistics.median(b)
                out[name][key] = {"first": round(first, 4), "last": round(last, 4),
                                  "ratio": round(last / first, 3) if first else None}
    return out


def per_batch_seconds(log: Path) -> list[float]:
    """Plan + commit seconds of each batch, in commit order, from a follower's `phase` lines."""
    plan, out = {}, []
    for event in phases(log.read_text()):
        if event.get("phase") == "plan":
            plan[event["batch_id"]] = event["seconds"]
        elif event.get("phase") == "commit" and event["batch_id"] in plan:
            out.append(plan.pop(event["batch_id"]) + event["seconds"])
    return out


def rollups_gave_way(log: Path) -> int:
    """How many times a follower's rollup began giving way (to a reader of the target, say: it then rests and
    the target stays over its bound until it merges again)."""
    return log.read_text().count("upkeep rollup gave way")


def soak(args) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="lb_soak_"))
    broker = BrokerProcess({name: args.partitions for name in PIPELINES})
    url = fresh_database(f"{DB_PREFIX}history")
    env = child_env(LEDGERBATCH_DB_URL=url, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap,
                    LEDGERBATCH_PIPELINES_DIR=str(workdir))
    write_specs(workdir, args.compact_after, args.base_records)
    migrate(env)
    specs = {name: load_spec(workdir, name) for name in PIPELINES}
    engine = create_engine(url)
    with engine.connect() as conn:
        autovacuum = conn.execute(text("SHOW autovacuum")).scalar_one() == "on"
    trickle = Trickle(broker.bootstrap, args.rate, args.partitions)
    followers, logs, samples = {}, {}, []
    produce_orders(broker.bootstrap, "soak_append", args.base_records, args.partitions)  # the base, none poison
    trickle.sent["soak_append"] += args.base_records
    started = time.monotonic()
    try:
        for name in PIPELINES:
            logs[name] = workdir / f"{name}.log"
            followers[name] = subprocess.Popen(
                [str(BIN / "ledgerbatch"), "run", name, "--follow", "--idle-seconds", "0.02",
                 "--upkeep-seconds", f"{args.compact_after / 2:g}", "--master", "local[1]"],
                env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=logs[name].open("w"), start_new_session=True)
        while delivered(engine, "soak_append") < args.base_records:  # the base, before the trickle begins
            alive(followers, logs)
            time.sleep(0.5)
        trickle.start()
        while not all(exists(engine, name) for name in PIPELINES):  # each follower's first batch made its target
            alive(followers, logs)
            time.sleep(0.5)
        while True:
            time.sleep(args.sample_every)
            alive(followers, logs)
            samples.append(sample(engine, specs, started, autovacuum))
            print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
            if all(samples[-1][name]["batches"] >= args.batches for name in PIPELINES):
                break
            if args.max_minutes and time.monotonic() - started > args.max_minutes * 60:
                print(f"--max-minutes {args.max_minutes:g} reached before --batches {args.batches}", file=sys.stderr)
                break
        trickle.stop.set()
        trickle.join()
        deadline = time.monotonic() + 300  # the followers deliver the rest of the trickle
        while time.monotonic() < deadline and not caught_up(engine, trickle):
            time.sleep(1)
    finally:
        trickle.stop.set()
        for proc in followers.values():
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in followers.values():
            proc.wait(120)
        broker.close()
    checks = exactly_once(engine, specs, trickle)
    per_batch = {name: per_batch_seconds(logs[name]) for name in PIPELINES}
    gave_way = {name: rollups_gave_way(logs[name]) for name in PIPELINES}
    engine.dispose()
    with create_engine(SERVER_URL, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{DB_PREFIX}history" WITH (FORCE)'))
    return {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "seconds": round(time.monotonic() - started),
            "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "checks": checks,
            "first_and_last": first_and_last(samples, per_batch, args.window),
            "samples": samples, "per_batch_plan_commit_s": per_batch, "rollups_gave_way": gave_way}


def alive(followers: dict, logs: dict) -> None:
    for name, proc in followers.items():
        if proc.poll() is not None:
            raise RuntimeError(f"{name}: the follower exited ({proc.returncode}): {logs[name].read_text()[-2000:]}")


def exists(engine, name: str) -> bool:
    with engine.connect() as conn:
        return conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": f"public.{name}"}).scalar_one()


def delivered(engine, name: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT coalesce(sum(next_offset - start_offset), 0) FROM ledger.cursors "
                                 "WHERE pipeline = :p"), {"p": name}).scalar_one()


def caught_up(engine, trickle: Trickle) -> bool:
    return all(delivered(engine, name) == trickle.sent[name] for name in PIPELINES)


def exactly_once(engine, specs: dict, trickle: Trickle) -> dict:
    """Every produced record delivered once: the append target's rows, quarantined and purged records add up
    to what was produced; the upsert target holds every key once; `verify` finds nothing."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT count(*), count(DISTINCT (_partition, _offset)) FROM public.soak_append")).one()
        kept = conn.execute(text("SELECT count(*) FROM ledger.quarantine WHERE pipeline = 'soak_append'")).scalar_one()
        purged = conn.execute(text("SELECT coalesce(sum(quarantine_purged), 0)::bigint FROM ledger.compactions "
                                   "WHERE pipeline = 'soak_append'")).scalar_one()
        keys = conn.execute(text("SELECT count(*) FROM public.soak_upsert")).scalar_one()
    checks = {"produced": dict(trickle.sent), "append_rows": rows[0], "append_quarantined": kept,
              "append_purged": purged, "upsert_keys": keys,
              "violations": {name: verify(engine, spec) for name, spec in specs.items()}}
    checks["ok"] = (rows[0] == rows[1] and rows[0] + kept + purged == trickle.sent["soak_append"]
                    and keys == len(trickle.keys)
                    and not any(checks["violations"].values()))
    return checks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=10_000, help="per pipeline (default 10,000: 20,000 in all)")
    p.add_argument("--window", type=int, default=1000, help="first and last this many batches are compared")
    p.add_argument("--rate", type=float, default=60.0, help="records a second into each topic (default 60)")
    p.add_argument("--partitions", type=int, default=1, help="of each topic (default 1: a batch is one Spark task)")
    p.add_argument("--base-records", type=int, default=1_000_000, metavar="N",
                   help="orders in the append target before the trickle begins (default 1,000,000)")
    p.add_argument("--compact-after", type=float, default=20.0, metavar="S",
                   help="history.compact_after and errors.quarantine_retention, in seconds (default 20)")
    p.add_argument("--sample-every", type=float, default=10.0, metavar="S")
    p.add_argument("--max-minutes", type=float, help="stop sampling after this long even if --batches is not reached")
    p.add_argument("--out", type=Path, help="write the whole result (every sample) here as soak.json")
    p.add_argument("--docs", type=Path, help="write soak.png here")
    args = p.parse_args(argv)
    result = soak(args)
    print(json.dumps({k: v for k, v in result.items() if k not in ("samples", "per_batch_plan_commit_s")}, indent=2))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "soak.json").write_text(json.dumps(result, indent=1))
    if args.docs:
        from .soak_plot import plot

        args.docs.mkdir(parents=True, exist_ok=True)
        plot(result, args.docs / "soak.png")
    return 0 if result["checks"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

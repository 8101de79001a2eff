"""The benchmark's figures as a terminal table, a JSON file and docs/benchmarks.md."""
from __future__ import annotations

import json
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path

from .common import SERVER_URL, scalar

CONTENDERS = [("floor", "floor: 2-process consumer + COPY"), ("peer", "peer: Airflow ConsumeFromTopicOperator"),
              ("ledgerbatch_one", "ledgerbatch, one batch (cold: `ledgerbatch run`, new JVM)"),
              ("ledgerbatch_warm", "ledgerbatch, one batch (warm driver: `run --follow`)"),
              ("ledgerbatch_avro_warm", "ledgerbatch, one batch of Avro (warm driver: `run --follow`)"),
              ("ledgerbatch_aggregate_warm", "ledgerbatch, one batch into a per-minute aggregate (warm; rows: groups)"),
              ("ledgerbatch_filter_warm", "ledgerbatch, one batch through a filtering query (warm)"),
              ("ledgerbatch_several", "ledgerbatch, 4 batches (cold)")]


def machine() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"model name\s*:\s*(.*)", cpuinfo)
    mem = subprocess.run(["free", "-m"], capture_output=True, text=True).stdout.split("\n")[1].split()
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    versions = {pkg: metadata.version(pkg) for pkg in ("pyspark", "confluent-kafka", "apache-airflow",
                                                         "apache-airflow-providers-apache-kafka", "psycopg2-binary")}
    return {"cpu": model.group(1) if model else platform.processor(), "cores": cpuinfo.count("processor\t:"),
            "memory_mib": int(mem[1]), "kernel": platform.release(), "python": platform.python_version(),
            "java": java[0] if java else "?", "postgresql": scalar(SERVER_URL, "SHOW server_version"), **versions}


def _fmt(value, spec: str = ".2f", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def targets(r: dict) -> list[dict]:
    """The issue's targets, each with its measured value; None where this run could not measure it."""
    c, lat = r["contenders"], r["latency"]
    one, warm, avro = c["ledgerbatch_one"], c["ledgerbatch_warm"], c["ledgerbatch_avro_warm"]
    small = c["ledgerbatch_small_batch"]
    agg, filt = c["ledgerbatch_aggregate_warm"], c["ledgerbatch_filter_warm"]
    drifts = {}
    for mode in ("append", "aggregate"):
        scale = [s["plan_commit_s"] for s in r["scaling"] if s.get("mode", "append") == mode]
        drifts[mode] = max(abs(s / scale[0] - 1) for s in scale) if scale else None

    def growth(role: str):
        a, b = small["memory_mib"].get(role), one["memory_mib"].get(role)
        return b / a - 1 if a and b else None

    rows = [
        ("throughput ledgerbatch cold / peer", c["peer"]["wall_s"] / one["wall_s"], ">= 3x", lambda v: v >= 3, ".2f", "x"),
        ("throughput ledgerbatch warm / peer", c["peer"]["wall_s"] / warm["wall_s"], ">= 3x", lambda v: v >= 3, ".2f", "x"),
        ("wall ledgerbatch cold / floor (one batch)", one["wall_s"] / c["floor"]["wall_s"], "<= 1.25x", lambda v: v <= 1.25, ".2f", "x"),
        ("wall ledgerbatch warm / floor (one batch)", warm["wall_s"] / c["floor"]["wall_s"], "<= 1.25x", lambda v: v <= 1.25, ".2f", "x"),
        ("wall ledgerbatch Avro warm / floor (one batch)", avro["wall_s"] / c["floor"]["wall_s"], "<= 1.25x", lambda v: v <= 1.25, ".2f", "x"),
        ("wall ledgerbatch Avro warm / JSON warm (one batch)", avro["wall_s"] / warm["wall_s"], "<= 1.1x", lambda v: v <= 1.1, ".2f", "x"),
        ("registry requests per schema id per decoding task (Avro, worst run)", r["registry"]["per_id_per_task"], "<= 1",
         lambda v: v <= 1, ".2f", ""),
        ("commit share of the one-batch wall, cold", one["commit_share"], "<= 10%", lambda v: v <= 0.10, ".1%", ""),
        ("commit share of the one-batch wall, warm", warm["commit_share"], "<= 10%", lambda v: v <= 0.10, ".1%", ""),
        ("100 records warm", lat["warm"]["median_s"], "<= 3 s", lambda v: v <= 3, ".2f", " s"),
        ("100 records cold", lat["cold"]["median_s"], "<= 12 s", lambda v: v <= 12, ".2f", " s"),
        ("plan+commit drift over historic batches", drifts["append"], "within 20%", lambda v: v <= 0.20, ".1%", ""),
        ("plan+commit drift over historic batches, aggregate", drifts["aggregate"], "within 20%", lambda v: v <= 0.20, ".1%", ""),
        ("commit share of the one-batch wall, aggregate warm", agg["commit_share"], "<= 10%", lambda v: v <= 0.10, ".1%", ""),
        ("aggregate totals equal the produced records' totals (median run)", agg.get("totals_equal"), "yes",
         lambda v: v is True, "", ""),
        ("wall ledgerbatch aggregate warm / floor (one batch)", agg["wall_s"] / c["floor"]["wall_s"], "<= 1.25x",
         lambda v: v <= 1.25, ".2f", "x"),
        ("wall ledgerbatch filter warm / floor (one batch)", filt["wall_s"] / c["floor"]["wall_s"], "<= 1.25x",
         lambda v: v <= 1.25, ".2f", "x"),
        ("wall ledgerbatch JSON warm / floor (one batch), issue #25", warm["wall_s"] / c["floor"]["wall_s"], "<= 1.0x",
         lambda v: v <= 1.0, ".2f", "x"),
        ("aggregate time a record, largest size / this run's batch", _size_drift(r), "flat (within 20%)",
         lambda v: v <= 0.20, "+.1%", ""),
        ("driver memory growth, small -> full batch", growth("python"), "flat (<= 20%)", lambda v: v <= 0.20, "+.1%", ""),
        ("executor memory growth, small -> full batch", growth("executor"), "flat (<= 20%)", lambda v: v <= 0.20, "+.1%", ""),
        ("JVM memory growth, small -> full batch", growth("jvm"), "flat (<= 20%)", lambda v: v <= 0.20, "+.1%", ""),
    ]
    return [{"what": what, "value": value, "shown": _fmt(value, spec, unit), "target": target,
             "met": None if value is None else bool(ok(value))} for what, value, target, ok, spec, unit in rows]


def _size_drift(r: dict):
    """How far the aggregate's time a record at the largest --sizes batch is from the main runs' batch."""
    sizes = r.get("sizes") or []
    if not sizes:
        return None
    agg, records = r["contenders"]["ledgerbatch_aggregate_warm"], r["config"]["records"]
    largest = max(sizes, key=lambda x: x["records"])
    return abs((largest["aggregate_s"] / largest["records"]) / (agg["wall_s"] / records) - 1)


def _verdict(met) -> str:
    return "n/a" if met is None else "met" if met else "MISSED"


def tables(r: dict) -> str:
    """Markdown tables; they read well in a terminal too."""
    c, records = r["contenders"], r["config"]["records"]
    out = ["| contender | wall s (median) | all runs s | records/s | peak memory MiB | rows |",
           "| --- | ---: | --- | ---: | ---: | ---: |"]
    for key, label in CONTENDERS:
        x = c[key]
        out.append(f"| {label} | {x['wall_s']:.2f} | {', '.join(f'{w:.2f}' for w in x['walls_s'])} | "
                   f"{records / x['wall_s']:,.0f} | {x['memory_mib']['total']:,.0f} | {x['rows']:,} |")
    one, warm, small = c["ledgerbatch_one"], c["ledgerbatch_warm"], c["ledgerbatch_small_batch"]
    avro, reg = c["ledgerbatch_avro_warm"], r["registry"]
    out.append("")
    for label, x in (("cold", one), ("warm", warm)):
        out.append(f"ledgerbatch {label}/floor wall: {x['wall_s'] / c['floor']['wall_s']:.2f}x; "
                   f"peer/ledgerbatch {label} wall: {c['peer']['wall_s'] / x['wall_s']:.2f}x.")
    out.append(f"ledgerbatch Avro warm/JSON warm wall: {avro['wall_s'] / warm['wall_s']:.2f}x; "
               f"Avro warm/floor wall: {avro['wall_s'] / c['floor']['wall_s']:.2f}x.")
    agg, filt = c["ledgerbatch_aggregate_warm"], c["ledgerbatch_filter_warm"]
    out.append(f"Warm, on the same data: aggregate/JSON append wall {agg['wall_s'] / warm['wall_s']:.2f}x, "
               f"aggregate/floor {agg['wall_s'] / c['floor']['wall_s']:.2f}x ({agg['groups']} groups, totals equal: "
               f"{'yes' if agg['totals_equal'] else 'NO'}); filter/JSON append {filt['wall_s'] / warm['wall_s']:.2f}x, "
               f"filter/floor {filt['wall_s'] / c['floor']['wall_s']:.2f}x ({filt['filtered']:,} records filtered).")
    out.append(f"The peer's wall is dag.test() alone (its whole process: {c['peer']['process_wall_s']:.2f} s).")
    for label, x in (("cold", one), ("warm", warm), ("Avro warm", avro), ("aggregate warm", agg),
                     ("filter warm", filt)):
        phases = x.get("phase_s")
        out.append(f"ledgerbatch one batch {label}, phases: " + (
            ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()) + f"; commit share {_fmt(x['commit_share'], '.1%')}"
            if phases else "no phase lines in its log: commit share n/a"))
    out.append(f"Schema registry, Avro warm: GET /schemas/ids/{{id}} requests per run "
               f"{', '.join(str(x['schema_id_requests']) for x in reg['runs'])} for {len(reg['schema_ids'])} schema id(s) "
               f"and {', '.join(str(x['decoding_tasks']) for x in reg['runs'])} decoding tasks (the warm-up's and the "
               f"batch's staging tasks): "
               f"{reg['per_id_per_task']:.2f} requests per schema id per task (worst run).")
    out += ["", "| ledgerbatch peak memory (PSS) MiB | batch of " f"{small['batch_records']:,} | batch of {one['batch_records']:,} |",
            "| --- | ---: | ---: |"]
    for role in ("python", "jvm", "executor", "total"):
        label = {"python": "driver (Python)", "jvm": "JVM", "executor": "Spark Python workers", "total": "total"}[role]
        out.append(f"| {label} | {_fmt(small['memory_mib'].get(role), ',.0f')} | {_fmt(one['memory_mib'].get(role), ',.0f')} |")
    lat = r["latency"]
    out += ["", "| 100 records, produced -> committed | median s | runs s |", "| --- | ---: | --- |",
            f"| cold (fresh `ledgerbatch run`, new JVM) | {_fmt(lat['cold']['median_s'])} | {', '.join(map(str, lat['cold']['walls_s']))} |",
            f"| warm (`ledgerbatch run --follow`) | {_fmt(lat['warm']['median_s'])} | "
            f"{', '.join(map(str, lat['warm'].get('walls_s', []))) or lat['warm'].get('note', '')} |"]
    if lat["warm"].get("ledger_median_s") is not None:
        out.append(f"| warm, ledger committed_at - created_at | {lat['warm']['ledger_median_s']:.2f} | |")
    out += ["", "| target mode | historic batches in the ledger | plan s | commit s | plan + commit s (median) | "
                "replay commit s (median) | setup s |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for s in r["scaling"]:
        out.append(f"| {s.get('mode', 'append')} | {s['historic_batches']:,} | {s['plan_s']:.3f} | {s['commit_s']:.3f} | "
                   f"{s['plan_commit_s']:.3f} | {_fmt(s.get('replay_commit_s'), '.3f')} | {s['setup_s']} |")
    if r.get("sizes"):
        out += ["", "| aggregate batch of | floor s | aggregate s | aggregate µs a record | aggregate / floor |",
                "| --- | ---: | ---: | ---: | ---: |",
                f"| {records:,} (medians above) | {c['floor']['wall_s']:.2f} | {agg['wall_s']:.2f} | "
                f"{agg['wall_s'] / records * 1e6:.2f} | {agg['wall_s'] / c['floor']['wall_s']:.2f}x |"]
        out += [f"| {x['records']:,} (one run) | {x['floor_s']:.2f} | {x['aggregate_s']:.2f} | "
                f"{x['aggregate_s'] / x['records'] * 1e6:.2f} | {x['aggregate_s'] / x['floor_s']:.2f}x |" for x in r["sizes"]]
    out += ["", "| target | measured | wanted | verdict |", "| --- | ---: | --- | --- |"]
    out += [f"| {t['what']} | {t['shown']} | {t['target']} | {_verdict(t['met'])} |" for t in r["targets"]]
    return "\n".join(out)


def write_json(r: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{r['started'].replace(':', '').replace('-', '')}.json"
    path.write_text(json.dumps(r, indent=2, default=str))
    return path


BROKER_TEXT = {"kafka": "a real Apache Kafka 2.3.0 (`ledgerbatch dev-kafka`: one broker, ZooKeeper, Java 11)",
               "mock": "librdkafka's mock cluster (`ledgerbatch dev-broker`, 3 brokers, in memory)"}


def write_doc(r: dict, path: Path, plot_name: str) -> None:
    m, cfg = r["machine"], r["config"]
    path.write_text(f"""# Benchmarks

Generated by `{cfg['command']}` on {r['started']} (UTC); every figure below was measured in that one run.
Regenerate with `make bench` (the full form: about half an hour on 2 cores) or `make bench-smoke` (a
reduced form that CI runs as `tests/bench/test_bench_smoke.py`; it writes to `bench/results/smoke/`).

**Data**: {cfg['records']:,} JSON orders of about 90 bytes (`ledgerbatch.demodata.order`) in {cfg['partitions']}
partitions of one topic on {BROKER_TEXT[cfg.get('broker', 'mock')]}, every one checked to be retained from offset 0. Every contender reads the
same topic from offset 0 into its own fresh database; the harness checks each one's row count against the
records produced. Wall times are medians of {cfg['runs']} runs, interleaved (floor, peer, ledgerbatch, ... per run).
The same orders are produced once more, before any run and untimed, into a second topic of as many partitions as
Avro values (Confluent wire format) through confluent-kafka's `AvroSerializer` and the dev schema registry, for the
Avro contender.

![throughput, memory, latency and scaling]({plot_name})

{tables(r)}

## What each contender is

- **floor** (`bench/floor.py`): 2 OS processes, each owning half the partitions: confluent-kafka `assign()` from
  offset 0, `consume()` until the position reaches the end watermark, `json.loads`, text `COPY` in chunks of
  50,000 into a plain table with the target's columns (no index); no ledger, no exactly-once. Wall: both
  processes started to both done.
- **peer** (`bench/peer.py`, `bench/dags/bench_peer.py`): `ConsumeFromTopicOperator`
  (apache-airflow-providers-apache-kafka {m['apache-airflow-providers-apache-kafka']}) with an
  `apply_function_batch` doing psycopg2 `execute_values` INSERTs, `max_batch_size` 10,000, `max_messages` =
  the records, `commit_cadence="end_of_batch"` (at-least-once), a new consumer group per run, run with
  `dag.test()` against a PostgreSQL metadata database. Its wall is `dag.test()` alone, without Airflow's import.
- **ledgerbatch** (`bench/lb.py`): `ledgerbatch migrate`, then `ledgerbatch run` as a child process (plan +
  spark-submit process + commit, `local[*]`), `batch.max_records` = all records (one batch) or a quarter (4
  batches). Its wall includes Spark's start-up. **Warm driver**: `ledgerbatch run --follow`, which starts
  Spark and its Python workers before it plans; its wall is the batch's plan + process + commit seconds (so
  no start-up), memory is the follower's whole tree. Phase seconds come from the `phase {{json}}` lines of logger
  `ledgerbatch.events`. The memory split uses a third run shape: one batch of a tenth of the records.
- **ledgerbatch Avro** (`bench/avro.py`): the warm contender again, run right after the JSON one in every run,
  measured the same way, on the Avro topic: the same spec and target but `source.format: avro` and
  `source.schema_registry.url`; the values are the same orders with the schema `order_id` string, `customer`
  string, `amount` bytes decimal(12,2), `ts` long timestamp-micros. The registry is
  `ledgerbatch.dev.registry.DevRegistry` (in-memory, Confluent REST) in the harness's own process.
- **ledgerbatch aggregate and filter** (`bench/transforms.py`, issue #12): the warm contender again, on the same
  JSON topic and measured the same way, with `transform:` a Spark SQL query. The aggregate groups the orders into
  30 customers x 20 minutes (`CAST(substr(customer, 3) AS INT) % 30`, `minute(ts) % 20`, 600 groups) with
  `count(*)`, `sum`, `min` and `max` of the amount into a `mode: aggregate` target; its rows are groups. The
  harness computes the same 600 groups from the produced values with Python's `json` and `Decimal` and compares
  them with the target ("totals equal"). The filter keeps the orders with `amount >= 500` (`SELECT * FROM batch
  WHERE ...`) in an append target.
- **Registry requests**: the registry counts every request it receives by route; the harness reads the count of
  `GET /schemas/ids/{{id}}` (how a deserializer fetches a writer schema) before starting the Avro follower and
  after it has exited, so everything the follower asked for is in it. The staging tasks are not counted from the
  requests but computed as `plugins/ledgerbatch/stage/driver.py` starts them: min(ranges of the batch, from
  `ledger.batch_ranges`, 2 x Spark's default parallelism, which under `local[*]` is the cores the process may
  use); the follower's warm-up decodes the topic's newest records in as many tasks again, each with its own
  decoder. The schema ids are those in the produced values' wire-format prefix. The figure is requests / (schema
  ids x decoding tasks), of the worst run.
- **Aggregate at growing sizes** (`bench/sizes.py`, `--sizes`): for each size, its own topic of that many
  orders (same partitions), then one run of the floor and one of the warm aggregate contender on it, measured as
  above; the aggregate's totals are checked against the produced values' at every size. One run each, so no
  medians: the first row is the main runs' medians.
- **Peak memory**: the process tree (children included) sampled every 250 ms, the peak of the summed PSS (the kernel's `smaps_rollup`).
  PSS rather than RSS because Spark's Python workers fork from one daemon and share most pages. Roles: `java`
  is the JVM (driver and executors of `local[*]`), a Python process under the JVM is a Spark Python worker,
  any other Python is the driver.
- **Latency**: cold = wall of `ledgerbatch run` for 100 new records (a fresh spark-submit). Warm = one
  `ledgerbatch run --follow --idle-seconds 0.1`; after its first batch, 100 records are produced (flushed), and
  the clock runs until the ledger's cursors cover them (polled every 50 ms); `committed_at - created_at` of
  that batch is shown too.
- **Scaling** (`bench/scaling.py`): a fresh ledger gets N historic committed live batches inserted with
  `generate_series` — batch i covers one contiguous range of partition i mod P, together tiling [0, end) of
  every partition of the benchmark topic, cursors at the end — so every constraint (reconciled counts, the
  exclusion constraint on committed ranges, cursor/last-batch consistency) holds and the indexes are as big
  as N batches make them. Then 100 new records are produced and go through the real `plan_next` ->
  `process_batch` -> `commit_batch`, one SparkSession for all N; plan and commit are timed in-process
  (median of {cfg.get('scaling_repeats', cfg['latency_repeats'])}, after one untimed warm-up batch). Ranges tile real offsets (not empty
  ranges), so the exclusion constraint's GiST index holds N real ranges. The target holds only the new rows:
  what grows is the ledger. The **aggregate** rows do the same for the aggregate pipeline (up to 100,000 historic
  batches), with 6 contributions per historic batch in `ledger_aggregates` and their merge in the target; its
  "replay commit" is the median commit of a replay of the last new batch, which recomputes that batch's groups
  from every contribution to them.

## Exact commands

```bash
{cfg['command']}
make bench          # python -m bench.run --records 1000000 --partitions 32 --runs 3 --historic 1000,100000,1000000 --sizes 4000000,10000000
make bench-smoke    # python -m bench.run --records 20000 --partitions 4 --runs 1 --historic 100,1000 --latency-repeats 1 --scaling-repeats 2 --sizes 40000 --docs bench/results/smoke
```

## Machine

| | |
| --- | --- |
| CPU | {m['cpu']}, {m['cores']} cores |
| memory | {m['memory_mib']:,} MiB |
| kernel | {m['kernel']} |
| load average (1 min) at start / end | {' / '.join(map(str, m.get('load_1min', ['not recorded'])))} (other work on the cores slows every contender) |
| PostgreSQL | {m['postgresql']} (local, default settings) |
| Python / Java | {m['python']} / {m['java']} |
| pyspark / confluent-kafka | {m['pyspark']} / {m['confluent-kafka']} |
| Airflow / Kafka provider | {m['apache-airflow']} / {m['apache-airflow-providers-apache-kafka']} |
| Kafka | {BROKER_TEXT[cfg.get('broker', 'mock')]} on 127.0.0.1 |
""")

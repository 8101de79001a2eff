"""The `ledgerbatch` command line."""
from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import sys
import threading

from sqlalchemy.exc import SQLAlchemyError

from ledgerbatch.config import Settings, safe_url
from ledgerbatch.errors import ConfigError, LedgerbatchError, SpecError

log = logging.getLogger("ledgerbatch")


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _positive_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {value}")
    return x


def _natural(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number >= 0")
    return int(value)


def _partition_list(value: str) -> tuple[int, ...]:
    parts = [p.strip() for p in value.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{value!r} must be partition numbers separated by commas, e.g. 0,1,5")
    return tuple(sorted({int(p) for p in parts}))


def _topic_arg(value: str) -> tuple[str, int]:
    name, _, partitions = value.partition(":")
    if not name or not partitions.isdigit() or int(partitions) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be NAME:PARTITIONS, e.g. orders:16")
    return name, int(partitions)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ledgerbatch", description="Exactly-once Kafka -> PostgreSQL batches with an offset ledger.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("migrate", help="apply sql/ migrations to LEDGERBATCH_DB_URL (safe to run again)")
    run = sub.add_parser("run", help="plan, process and commit batches until caught up")
    run.add_argument("pipeline", nargs="*",
                     help="the pipeline; with --follow, one or more, served in one process (docs/operations.md)")
    run.add_argument("--all", action="store_true",
                     help="with --follow: every spec in the pipelines folder, as it changes (added, changed, removed)")
    run.add_argument("--max-batches", type=_positive, metavar="N", help="stop after N committed batches")
    run.add_argument("--master", help="Spark master (default LEDGERBATCH_SPARK_MASTER or local[*])")
    run.add_argument("--remote", metavar="sc://HOST:PORT",
                     help="run on this Spark Connect server (default LEDGERBATCH_SPARK_REMOTE; --master overrides it)")
    run.add_argument("--follow", action="store_true",
                     help="never stop at caught up: keep Spark warm and plan again every --idle-seconds until SIGTERM")
    run.add_argument("--idle-seconds", type=_positive_float, default=1.0, metavar="S",
                     help="with --follow: how long to wait before planning again when caught up (default 1)")
    run.add_argument("--backoff-initial", type=_positive_float, default=1.0, metavar="S",
                     help="with --follow: the first wait after a dependency went away, doubling (default 1)")
    run.add_argument("--backoff-max", type=_positive_float, default=60.0, metavar="S",
                     help="with --follow: the longest wait between tries while a dependency is away (default 60)")
    run.add_argument("--same-error-limit", type=_positive, default=10, metavar="N",
                     help="with --follow: stop after the same staging error N times in a row while the database "
                          "and Kafka answer (default 10)")
    run.add_argument("--rescan-seconds", type=_positive_float, default=10.0, metavar="S",
                     help="several pipelines or --all: how often the pipelines folder is read again (default 10)")
    run.add_argument("--retry-stopped-seconds", type=_positive_float, default=300.0, metavar="S",
                     help="several pipelines or --all: when a pipeline stopped by an error starts again, unless its "
                          "spec changes first (default 300)")
    run.add_argument("--upkeep-seconds", type=_positive_float, default=60.0, metavar="S",
                     help="compact and purge as the spec asks when it starts, then every S seconds (default 60)")
    run.add_argument("--metrics-port", type=_positive, metavar="N",
                     help="serve the metrics for Prometheus on http://HOST:N/metrics while it runs (docs/observability.md)")
    run.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                     help="the address --metrics-port listens on (default 127.0.0.1; 0.0.0.0 for every interface)")
    serve = sub.add_parser("metrics-serve", help="serve every pipeline's lag in offsets and seconds for Prometheus")
    serve.add_argument("--port", type=_positive, default=9464, metavar="N", help="default 9464")
    serve.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1; 0.0.0.0 for every interface")
    serve.add_argument("--interval", type=_positive_float, default=15.0, metavar="S",
                       help="measure the lag every S seconds (default 15)")
    replay = sub.add_parser("replay", help="re-deliver an explicit range (what the backfill DAG does, without Airflow)")
    replay.add_argument("pipeline")
    replay.add_argument("--topic", help="default: the pipeline's only topic")
    replay.add_argument("--partitions", type=_partition_list, metavar="0,1,...", help="default: every partition")
    replay.add_argument("--from-offset", type=_natural, metavar="X", help="first offset (inclusive)")
    replay.add_argument("--until-offset", type=_positive, metavar="Y", help="end offset (exclusive)")
    replay.add_argument("--from-time", metavar="ISO", help="or a time window: ISO-8601 start")
    replay.add_argument("--until-time", metavar="ISO", help="ISO-8601 end of the time window")
    replay.add_argument("--dry-run", action="store_true", help="stage and print the diff; the target is not touched")
    replay.add_argument("--master", help="Spark master (default LEDGERBATCH_SPARK_MASTER or local[*])")
    replay.add_argument("--remote", metavar="sc://HOST:PORT",
                        help="run on this Spark Connect server (default LEDGERBATCH_SPARK_REMOTE; --master overrides it)")
    status = sub.add_parser("status", help="per partition: cursor, end offset, lag, retention headroom, last batch")
    status.add_argument("pipeline", nargs="?", help="one pipeline (default: every spec in the pipelines dir)")
    status.add_argument("--json", action="store_true", help="print a JSON list of pipelines, for scripts")
    verify = sub.add_parser("verify", help="check the exactly-once invariants; exit 1 naming each violation")
    verify.add_argument("pipeline")
    verify.add_argument("--deep", action="store_true", help="also read the committed ranges from Kafka again and "
                                                           "compare every record with the target and the quarantine")
    verify.add_argument("--since", type=_positive, default=0, metavar="BATCH", help="--deep: batches from this id on")
    verify.add_argument("--sample", type=_positive_float, default=1.0, metavar="FRACTION",
                        help="--deep: this fraction of the batches (default all)")
    verify.add_argument("--master", help="--deep: Spark master (default LEDGERBATCH_SPARK_MASTER or local[*])")
    verify.add_argument("--remote", metavar="sc://HOST:PORT", help="--deep: run on this Spark Connect server")
    loss = sub.add_parser("acknowledge-loss", help="record offsets deleted from Kafka before delivery, so the pipeline can go on")
    loss.add_argument("pipeline")
    loss.add_argument("--by", required=True, metavar="NAME", help="who acknowledges the loss")
    loss.add_argument("--reason", help="why (ticket, incident)")
    abandon = sub.add_parser("abandon", help="give up an unfinished batch (nothing of it is committed; the next run plans again)")
    abandon.add_argument("pipeline")
    abandon.add_argument("batch_id", type=_positive, metavar="BATCH_ID")
    abandon.add_argument("--by", required=True, metavar="NAME", help="who abandons it")
    abandon.add_argument("--reason", help="why (ticket, spec change)")
    offsets = sub.add_parser("offsets", help="cursors, log start and end, lag per partition; with --set, move the "
                                             "cursors (recorded in ledger.offset_moves)")
    offsets.add_argument("pipeline")
    offsets.add_argument("--set", action="store_true", help="move the cursors (no batch may be open)")
    to = offsets.add_mutually_exclusive_group()
    to.add_argument("--to-time", metavar="ISO", help="the first offset at or after this time (ISO-8601; UTC if no zone)")
    to.add_argument("--to-offset", type=_natural, metavar="N")
    to.add_argument("--to-earliest", action="store_true", help="the log start")
    to.add_argument("--to-latest", action="store_true", help="the log end (read_committed)")
    offsets.add_argument("--topic", help="default: every topic of the pipeline")
    offsets.add_argument("--partitions", type=_partition_list, metavar="0,1,...", help="default: every partition")
    offsets.add_argument("--by", metavar="NAME", help="who moves them (with --set)")
    offsets.add_argument("--reason", metavar="TEXT", help="why (with --set)")
    offsets.add_argument("--dry-run", action="store_true", help="show the moves; change nothing")
    pause = sub.add_parser("pause", help="hold a pipeline still: no new batch is planned (an open one may finish)")
    pause.add_argument("pipeline")
    pause.add_argument("--by", required=True, metavar="NAME", help="who pauses it")
    pause.add_argument("--reason", required=True, metavar="TEXT", help="why (ticket, incident)")
    resume = sub.add_parser("resume", help="let a paused pipeline plan batches again")
    resume.add_argument("pipeline")
    resume.add_argument("--by", required=True, metavar="NAME", help="who resumes it")
    compact = sub.add_parser("compact", help="fold batches that finished before a time into one checkpoint per "
                                             "partition (verify still proves them); merge partitions over the bound")
    compact.add_argument("pipeline")
    compact.add_argument("--before", required=True, metavar="TIME",
                         help="ISO-8601 (UTC if no zone), or an age such as 30d, 12h or 90m")
    quarantine = sub.add_parser("quarantine", help="the quarantine's upkeep")
    quarantine_sub = quarantine.add_subparsers(dest="action", required=True, metavar="ACTION")
    purge = quarantine_sub.add_parser("purge", help="delete bad records quarantined before a time (their count "
                                                    "stays in ledger.compactions, so verify still reconciles)")
    purge.add_argument("pipeline")
    purge.add_argument("--before", required=True, metavar="TIME",
                       help="ISO-8601 (UTC if no zone), or an age such as 30d, 12h or 90m")
    broker = sub.add_parser("dev-broker", help="run librdkafka's mock Kafka cluster in the foreground (request-level fault injection)")
    broker.add_argument("--brokers", type=_positive, default=3)
    broker.add_argument("--topic", type=_topic_arg, action="append", default=[], metavar="NAME:PARTITIONS",
                        help="create a topic (repeatable); auto-created topics get 4 partitions")
    kafka = sub.add_parser("dev-kafka", help="run a real Apache Kafka (ZooKeeper + brokers on loopback) in the foreground")
    kafka.add_argument("--brokers", type=_positive, default=1)
    kafka.add_argument("--topic", type=_topic_arg, action="append", default=[], metavar="NAME:PARTITIONS",
                       help="create a topic (repeatable; replication min(3, brokers))")
    registry = sub.add_parser("dev-registry", help="run the local Schema Registry (REST subset) in the foreground")
    registry.add_argument("--host", default="127.0.0.1")
    registry.add_argument("--port", type=int, default=8081, help="0: any free port")
    registry.add_argument("--user-info", metavar="USER:PASSWORD", help="basic auth; requests without it get 401")
    server = sub.add_parser("spark-server", help="run a local Spark Connect server (from the pip wheel) in the foreground")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=_positive, default=15002)
    server.add_argument("--master", default="local[*]", help="the server's own Spark master (default local[*])")
    demo = sub.add_parser("demo", help="the platform on the embedded defaults: Apache Kafka, demo data, Airflow")
    demo.add_argument("--records", type=_positive, default=200_000)
    demo.add_argument("--partitions", type=_positive, default=16)
    demo.add_argument("--port", type=_positive, default=8080, help="Airflow UI port")
    demo.add_argument("--no-airflow", action="store_true", help="run the pipeline once without Airflow")
    return p


INSUFFICIENT_PRIVILEGE = "42501"
ROLE_RIGHTS = ("this login's role may not do that: compact, quarantine purge, offsets --set and acknowledge-loss "
               "need ledgerbatch_admin; run, replay and abandon ledgerbatch_writer (docs/operations.md, Database roles)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    for chatty in ("py4j", "httpx", "httpx2"):  # httpx: a line per Schema Registry request
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        settings = Settings.from_env()
        return COMMANDS[args.command](args, settings) or 0
    except SpecError as exc:
        print(f"ledgerbatch: bad pipeline spec: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"ledgerbatch: {exc}", file=sys.stderr)
        return 2
    except LedgerbatchError as exc:
        print(f"ledgerbatch: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ledgerbatch: interrupted; run again to resume", file=sys.stderr)
        return 130
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        if getattr(getattr(exc, "orig", None), "pgcode", None) == INSUFFICIENT_PRIVILEGE:
            reason += f" ({ROLE_RIGHTS})"
        print(f"ledgerbatch: database error: {reason}", file=sys.stderr)
        return 1
    except Exception as exc:  # one line for users; LEDGERBATCH_DEBUG=1 shows the traceback
        if os.environ.get("LEDGERBATCH_DEBUG"):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"ledgerbatch: unexpected {type(exc).__name__}: {first} (LEDGERBATCH_DEBUG=1 shows details)", file=sys.stderr)
        return 1


def _spec(settings: Settings, name: str):
    from ledgerbatch.spec.resolve import load_pipeline  # here, not at the top: `--help` stays quick

    return load_pipeline(settings, name)


def _engine(settings: Settings, require_ledger: bool = True):
    from ledgerbatch.ledger.engine import make_engine
    from ledgerbatch.ledger.migrations import pending

    engine = make_engine(settings.db_url)
    if require_ledger and pending(engine):
        raise ConfigError(f"the ledger in {safe_url(settings.db_url)} is not migrated: run `ledgerbatch migrate` first")
    return engine


def cmd_migrate(args, settings: Settings) -> None:
    from ledgerbatch.ledger.migrations import migrate

    applied = migrate(_engine(settings, require_ledger=False))
    print(f"ledger at {safe_url(settings.db_url)}: " + (f"applied migrations {applied}" if applied else "up to date"))


def _spark_factory(args, settings: Settings, app_name: str):
    """The command's Spark session maker: `--master`, else `--remote` or LEDGERBATCH_SPARK_REMOTE (a Spark Connect
    server), else LEDGERBATCH_SPARK_MASTER or local[*]."""
    from ledgerbatch.spark.session import get_spark

    remote = None if args.master else (args.remote or settings.spark_remote)
    if remote:
        def connect():
            log.info("Spark: a session on the Spark Connect server %s", remote.split(";")[0])
            spark = get_spark(app_name=app_name, remote=remote)
            atexit.register(spark.stop)  # the server's session ends with the command; the server stays up
            return spark
        return connect
    master = args.master or settings.spark_master
    return lambda: get_spark(master, app_name)


def cmd_run(args, settings: Settings) -> None:
    from ledgerbatch.ops.outages import Backoff
    from ledgerbatch.ops.run import run_pipeline

    if args.all or len(args.pipeline) != 1:
        return _serve(args, settings)
    spec = _spec(settings, args.pipeline[0])
    bootstrap = settings.require_bootstrap()
    engine = _engine(settings)
    spark_factory = _spark_factory(args, settings, f"ledgerbatch-{spec.name}")
    stop = threading.Event()
    if args.follow:  # SIGTERM finishes the batch in hand, then stops: nothing to resume
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    _serve_metrics(args)
    summary = run_pipeline(engine, spec, settings.db_url, bootstrap, spark_factory,
                           max_batches=args.max_batches, follow_idle_s=args.idle_seconds if args.follow else None,
                           stop=stop, backoff=Backoff(args.backoff_initial, args.backoff_max, args.same_error_limit),
                           upkeep_every_s=args.upkeep_seconds)
    rate = summary.records_read / summary.seconds if summary.seconds else 0
    print(f"{spec.name}: {summary.batches} batches committed, {summary.records_read} records read, "
          f"{summary.rows_written} rows written, {summary.rows_quarantined} quarantined"
          + (f" ({summary.rows_rejected} refused by the target)" if summary.rows_rejected else "")
          + f" in {summary.seconds:.1f}s "
          f"({rate:,.0f} records/s)")


def _serve_metrics(args) -> None:
    if args.metrics_port:
        from ledgerbatch.ops.metrics import serve_prometheus

        serve_prometheus(args.metrics_port, args.metrics_host)


def _serve(args, settings: Settings) -> None:
    """`run --follow` of several pipelines (or --all) in one process: ops/service.py."""
    from ledgerbatch.ops.outages import Backoff
    from ledgerbatch.ops.service import Service, SpecFolder

    if args.all == bool(args.pipeline):
        raise ConfigError("name the pipelines to run, or give --all for every spec in the pipelines folder (not both)")
    if not args.follow or args.max_batches:
        raise ConfigError("several pipelines (or --all) run only with --follow, and without --max-batches: "
                          "`ledgerbatch run --follow " + (" ".join(args.pipeline) or "--all") + "`")
    bootstrap = settings.require_bootstrap()
    engine = _engine(settings)
    specs = SpecFolder(settings.pipelines_dir, tuple(args.pipeline) or None, lambda name: _spec(settings, name))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # each pipeline finishes the batch in hand, then stops
    _serve_metrics(args)
    backoff = Backoff(args.backoff_initial, args.backoff_max, args.same_error_limit)
    followers = Service(engine, settings.db_url, bootstrap, _spark_factory(args, settings, "ledgerbatch-service"),
                        specs, stop, args.idle_seconds, backoff, args.upkeep_seconds, args.rescan_seconds,
                        args.retry_stopped_seconds).serve()
    for name, f in sorted(followers.items()):
        done = f.summary
        print(f"{name}: " + (f"stopped: {f.error}" if f.error else
                             f"{done.batches} batches committed, {done.records_read} records read, "
                             f"{done.rows_written} rows written, {done.rows_quarantined} quarantined"))
    stopped = sorted(name for name, f in followers.items() if f.error)
    if stopped:
        raise LedgerbatchError(f"{len(stopped)} of {len(followers)} pipelines stopped with an error: "
                               f"{', '.join(stopped)}")


def _all_specs(settings: Settings) -> list:
    from ledgerbatch.spec.pipeline import list_specs, with_kafka_options

    return [with_kafka_options(s, settings.kafka_options) for s in list_specs(settings.pipelines_dir)]


def cmd_status(args, settings: Settings) -> None:
    import json

    from ledgerbatch.ledger.batches import known_pipelines
    from ledgerbatch.ops.status import pipeline_status, render

    engine = _engine(settings)
    if args.pipeline:
        specs = [_spec(settings, args.pipeline)]
    else:
        specs = _all_specs(settings)
        with engine.connect() as conn:
            known = known_pipelines(conn)
        missing = sorted(set(known) - {s.name for s in specs})
        if missing:  # stderr: stdout stays valid JSON with --json
            print(f"(pipelines in the ledger without a spec in {settings.pipelines_dir}: {', '.join(missing)})",
                  file=sys.stderr)
    statuses = [pipeline_status(engine, spec.name, spec.topics, settings.bootstrap_servers, dict(spec.kafka_options))
                for spec in specs]
    print(json.dumps(statuses, indent=2) if args.json else "\n\n".join(render(s) for s in statuses))


def cmd_metrics_serve(args, settings: Settings) -> None:
    from ledgerbatch.ops.metrics import serve_lag

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    serve_lag(_engine(settings), _all_specs(settings), settings.require_bootstrap(), args.port, args.host,
              args.interval, stop)


def cmd_replay(args, settings: Settings) -> None:
    from ledgerbatch.ops.run import run_replay
    from ledgerbatch.plan.replay import request_from_params

    spec = _spec(settings, args.pipeline)
    request = request_from_params(spec, {"topic": args.topic, "partitions": args.partitions,
                                         "from_offset": args.from_offset, "until_offset": args.until_offset,
                                         "from_time": args.from_time, "until_time": args.until_time})
    outcome = run_replay(_engine(settings), spec, request, settings.db_url, settings.require_bootstrap(),
                         _spark_factory(args, settings, f"ledgerbatch-replay-{spec.name}"), args.dry_run)
    b = outcome.batch
    print(f"{spec.name}: {b.kind} batch {b.batch_id} over {', '.join(map(str, b.ranges))}")
    print(f"  {b.records_read} records read, {b.rows_written} delivered, {b.records_filtered} filtered, "
          f"{b.rows_quarantined} quarantined" + (f", {b.groups_written} groups" if b.groups_written is not None else ""))
    if outcome.diff is not None:
        d = outcome.diff
        print(f"  dry run, target unchanged (batch abandoned): {d.added} added, {d.removed} removed, "
              f"{d.changed} changed, {d.unchanged} unchanged")
    else:
        print("  committed in one transaction: what earlier deliveries of these ranges left in the target is replaced")


def cmd_verify(args, settings: Settings) -> int:
    from ledgerbatch.ops.verify import verify

    spec = _spec(settings, args.pipeline)
    if not args.deep and (args.since or args.sample != 1.0):
        raise LedgerbatchError("--since and --sample choose what verify --deep reads again: add --deep")
    problems = verify(_engine(settings), spec)
    for problem in problems:
        print(f"VIOLATION {spec.name}: {problem}")
    print(f"{spec.name}: {len(problems)} violations" if problems else f"{spec.name}: all invariants hold")
    if args.deep:
        from ledgerbatch.ops.deep_verify import deep_verify

        report = deep_verify(_engine(settings), spec, settings.db_url, settings.require_bootstrap(),
                             _spark_factory(args, settings, f"ledgerbatch-verify-{spec.name}"), args.since, args.sample)
        for r in report.not_checkable:
            print(f"NOT CHECKABLE {spec.name}: {r} ({r.span} offsets): no longer in Kafka (retention)")
        for problem in report.problems:
            print(f"MISMATCH {spec.name}: {problem}")
        if report.detailed_from > max(args.since, 1):
            print(f"{spec.name}: batches before #{report.detailed_from} were compacted or had bad records purged: "
                  f"verify proves them by tiling and counts, --deep reads the batches after them")
        print(f"{spec.name}: {report.records} offsets in {len(report.ranges)} ranges read again from Kafka: "
              + (f"{len(report.problems)} kinds of mismatch" if report.problems else "every record accounted for"))
        problems = problems + report.problems
    return 1 if problems else 0


def cmd_acknowledge_loss(args, settings: Settings) -> None:
    from ledgerbatch.ops.loss import acknowledge_loss

    spec = _spec(settings, args.pipeline)
    lost = acknowledge_loss(_engine(settings), spec, settings.require_bootstrap(), args.by, args.reason)
    for r in lost:
        print(f"{spec.name}: recorded lost {r} ({r.span} offsets), acknowledged by {args.by}")


def cmd_abandon(args, settings: Settings) -> None:
    from ledgerbatch.ops.abandon import abandon_batch

    spec = _spec(settings, args.pipeline)
    batch = abandon_batch(_engine(settings), spec, args.batch_id, args.by, args.reason)
    print(f"{spec.name}: {batch.kind} batch {batch.batch_id} ({batch.status}) abandoned by {args.by}; nothing of it "
          f"was committed" + ("; the next run plans its offsets again" if batch.kind == "live" else ""))


def cmd_offsets(args, settings: Settings) -> None:
    from ledgerbatch.ops.offsets import Target, recent_moves, set_offsets
    from ledgerbatch.ops.status import partition_table, pipeline_status

    spec = _spec(settings, args.pipeline)
    engine = _engine(settings)
    target = Target(args.to_time, args.to_offset, args.to_earliest, args.to_latest)
    if not args.set:
        if target != Target() or args.by or args.reason or args.dry_run:
            raise LedgerbatchError("--to-*, --by, --reason and --dry-run move the cursors: add --set")
        status = pipeline_status(engine, spec.name, spec.topics, settings.bootstrap_servers, dict(spec.kafka_options))
        print("\n".join([f"pipeline {spec.name}", *partition_table(status)]))
        for m in recent_moves(engine, spec):
            print(f"  moved #{m.move_id} {m.moved_at:%Y-%m-%d %H:%M:%S}: {m.topic}[{m.partition}] {m.from_offset} -> "
                  f"{m.to_offset} ({m.request}) by {m.moved_by}: {m.reason}")
        return
    moves = set_offsets(engine, spec, settings.require_bootstrap(), target, args.by, args.reason, args.topic,
                        list(args.partitions or ()), args.dry_run)
    print(f"{spec.name}: {'dry run, nothing moved' if args.dry_run else 'moved'} ({target}):")
    for m in moves:
        print(f"  {m}")


def cmd_pause(args, settings: Settings) -> None:
    from ledgerbatch.ops.pause import pause_pipeline

    spec = _spec(settings, args.pipeline)
    pause_pipeline(_engine(settings), spec, args.by, args.reason)
    print(f"{spec.name}: paused by {args.by} ({args.reason}); no new batch is planned until "
          f"`ledgerbatch resume {spec.name} --by NAME`")


def cmd_resume(args, settings: Settings) -> None:
    from ledgerbatch.ops.pause import resume_pipeline

    spec = _spec(settings, args.pipeline)
    pause = resume_pipeline(_engine(settings), spec, args.by)
    print(f"{spec.name}: resumed by {args.by} (it was {pause})")


def cmd_compact(args, settings: Settings) -> None:
    from ledgerbatch.commit.modes.rollup import bound_partitions
    from ledgerbatch.model.times import before_time
    from ledgerbatch.ops.history import compact

    spec, before = _spec(settings, args.pipeline), before_time(args.before)
    engine = _engine(settings)
    done = compact(engine, spec, before)
    merged = len(bound_partitions(engine, spec))
    print(f"{spec.name}: {done.batches} batches compacted (every batch through {done.through} is in the "
          f"checkpoints)" + (f", {done.deletes} deletes forgotten" if done.deletes else "")
          + ("; replays of the compacted offsets are refused from now on (ledger.checkpoints.replay_horizon)"
             if done.horizon else "") + (f"; {merged} partition rollups" if merged else ""))


def cmd_quarantine(args, settings: Settings) -> None:
    from ledgerbatch.model.times import before_time
    from ledgerbatch.ops.history import purge_quarantine

    spec, before = _spec(settings, args.pipeline), before_time(args.before)
    purged = purge_quarantine(_engine(settings), spec, before)
    print(f"{spec.name}: {purged} quarantined records older than {before.isoformat(timespec='seconds')} purged "
          f"(counted in ledger.compactions.quarantine_purged)")


def cmd_dev_broker(args, settings: Settings) -> None:
    from ledgerbatch.dev.broker import serve_forever

    serve_forever(args.brokers, dict(args.topic))


def cmd_dev_kafka(args, settings: Settings) -> None:
    from ledgerbatch.dev.kafka import serve_forever

    serve_forever(args.brokers, dict(args.topic))


def cmd_dev_registry(args, settings: Settings) -> None:
    from ledgerbatch.dev.registry import serve_forever

    serve_forever(args.port, args.host, args.user_info)


def cmd_spark_server(args, settings: Settings) -> int:
    from ledgerbatch.spark.server import serve_connect

    return serve_connect(args.port, args.host, args.master)


def cmd_demo(args, settings: Settings) -> None:
    if args.no_airflow:
        from ledgerbatch.dev.demo import run_without_airflow

        run_without_airflow(settings, args.records, args.partitions)
    else:
        from ledgerbatch.dev.airflow_demo import run_with_airflow

        run_with_airflow(settings, args.records, args.partitions, args.port)


COMMANDS = {"migrate": cmd_migrate, "run": cmd_run, "replay": cmd_replay, "status": cmd_status, "verify": cmd_verify,
            "acknowledge-loss": cmd_acknowledge_loss, "abandon": cmd_abandon, "offsets": cmd_offsets, "pause": cmd_pause,
            "resume": cmd_resume, "metrics-serve": cmd_metrics_serve, "compact": cmd_compact,
            "quarantine": cmd_quarantine,
            "dev-broker": cmd_dev_broker, "dev-kafka": cmd_dev_kafka,
            "dev-registry": cmd_dev_registry,
            "spark-server": cmd_spark_server, "demo": cmd_demo}

if __name__ == "__main__":
    sys.exit(main())

"""Operators: thin adapters over the ledgerbatch package. Every one is safe to retry at any point:
the ledger, not Airflow, decides what is planned, staged and committed.

`__init__` only keeps arguments; connections, the database and the spec file are read in `execute`,
through the hooks (LedgerHook owns the engine, KafkaConfigHook the Kafka settings)."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from ledgerbatch.airflow.hooks import (
    SPARK_CONNECT_CONN_ID,
    KafkaConfigHook,
    LedgerHook,
    settings_from_hooks,
    spark_connect_url,
)
from ledgerbatch.airflow.outcomes import commit_line, dry_run_line, moves_line, upkeep_line
from ledgerbatch.airflow.user_errors import refused
from ledgerbatch.config import STAGING_DB_URL, Settings, shipped
from ledgerbatch.model.range_text import compact_ranges
from ledgerbatch.ops.events import phase_event
from ledgerbatch.ops.metrics import record_lag
from ledgerbatch.spark.settings_file import kubernetes_secret_refs, write_settings_file
from ledgerbatch.spec.resolve import load_pipeline

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ledgerbatch.spec.pipeline import PipelineSpec

SPARK_JOB = shipped("spark_jobs") / "process_batch.py"


class LedgerbatchBaseOperator(BaseOperator):
    """The arguments every ledgerbatch operator shares, and its hooks (built on first use, in `execute`).

    The ShortCircuitOperator and SparkSubmitOperator subclasses put this class first among their bases:
    its `__init__` takes these arguments and hands the rest on to theirs.

    :param pipeline: Name of the pipeline spec, `<pipelines_dir>/<pipeline>.yaml` (templated).
    :param pipelines_dir: Directory of the pipeline specs.
    :param ledger_conn_id: Connection of the ledger and target database (see LedgerHook),
        defaults to "ledgerbatch_db".
    :param kafka_conn_id: Connection whose extra holds the librdkafka settings (see KafkaConfigHook),
        defaults to "ledgerbatch_kafka".
    """

    template_fields: Sequence[str] = ("pipeline",)

    def __init__(self, *, pipeline: str, pipelines_dir: str | Path,
                 ledger_conn_id: str = LedgerHook.default_conn_name,
                 kafka_conn_id: str = KafkaConfigHook.default_conn_name, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.pipelines_dir = str(pipelines_dir)
        self.ledger_conn_id = ledger_conn_id
        self.kafka_conn_id = kafka_conn_id

    @cached_property
    def ledger_hook(self) -> LedgerHook:
        return LedgerHook(self.ledger_conn_id)

    @cached_property
    def kafka_hook(self) -> KafkaConfigHook:
        return KafkaConfigHook(self.kafka_conn_id)

    @cached_property
    def settings(self) -> Settings:
        """The settings the CLI reads from the environment, from the two connections."""
        return settings_from_hooks(self.ledger_hook, self.kafka_hook, Path(self.pipelines_dir))

    def load_spec(self) -> PipelineSpec:
        """The pipeline's spec, with the Kafka connection's options under its own `source.kafka`."""
        return load_pipeline(self.settings, self.pipeline)

    def _engine_and_spec(self) -> tuple[Engine, PipelineSpec]:
        """Both connections first, then the database (checked reachable), then the spec file."""
        settings = self.settings
        return self.ledger_hook.get_engine(), load_pipeline(settings, self.pipeline)

    def _phase_event(self, phase: str, batch_id: int, started: float, **counts) -> None:
        """The phase's event line and metrics (ops/metrics.py: OTLP where the environment or Airflow's
        [metrics] otel_on says so)."""
        from ledgerbatch.ledger.batches import get_batch

        with self.ledger_hook.get_engine().connect() as conn:
            batch = get_batch(conn, batch_id)
        phase_event(phase, batch, time.monotonic() - started, in_airflow=True, **counts)


class PlanBatchOperator(LedgerbatchBaseOperator, ShortCircuitOperator):
    """Resume the unfinished live batch or plan the next one; returns its id. Nothing new: downstream is skipped.

    Takes the arguments of LedgerbatchBaseOperator; the others go to ShortCircuitOperator.
    """

    template_fields = (*ShortCircuitOperator.template_fields, *LedgerbatchBaseOperator.template_fields)

    def __init__(self, **kwargs: Any):
        super().__init__(python_callable=self._plan, **kwargs)

    def execute(self, context) -> int | None:
        # Airflow executes a copy of the parsed operator (rendered fields, hooks of this try): plan on it.
        self.python_callable = self._plan
        return super().execute(context)

    def _plan(self) -> int | None:
        from ledgerbatch.ops.pause import pause_of
        from ledgerbatch.plan.live import plan_next

        engine, spec = self._engine_and_spec()
        started = time.monotonic()
        batch = plan_next(engine, spec, self.kafka_hook.get_bootstrap_servers())
        if batch is None:
            pause = pause_of(engine, spec)
            if pause is not None:  # the run ends skipped, not failed: `ledgerbatch resume` lets it go again
                raise AirflowSkipException(f"{self.pipeline} is {pause}: no batch is planned")
            self.log.info("%s is caught up: no batch to run", self.pipeline)
            return None
        phase_event("plan", batch, time.monotonic() - started, in_airflow=True)
        self.log.info("batch %d (%s): %d offsets in %s", batch.batch_id, batch.status, batch.span,
                      compact_ranges(batch.ranges))
        return batch.batch_id


class PlanReplayOperator(LedgerbatchBaseOperator):
    """Plan a replay or backfill batch from the backfill DAG's params; returns its id.

    :param request: The backfill DAG's params (pipeline, topic, partitions, from/until offset or time),
        as a dict or its JSON (templated).
    """

    template_fields = (*LedgerbatchBaseOperator.template_fields, "request")

    def __init__(self, *, request: dict | str, **kwargs: Any):
        super().__init__(**kwargs)
        self.request = request

    def execute(self, context) -> int:
        from ledgerbatch.airflow.forms import replay_request
        from ledgerbatch.plan.replay import plan_replay, resolve_ranges

        engine, spec = self._engine_and_spec()
        params = json.loads(self.request) if isinstance(self.request, str) else self.request
        started = time.monotonic()
        with refused(self.dag_id):
            ranges = resolve_ranges(spec, self.kafka_hook.get_bootstrap_servers(), replay_request(spec, params))
            batch = plan_replay(engine, spec, ranges)
        phase_event("plan", batch, time.monotonic() - started, in_airflow=True)
        self.log.info("%s batch %d: %s", batch.kind, batch.batch_id, compact_ranges(batch.ranges))
        return batch.batch_id


class MoveOffsetsOperator(LedgerbatchBaseOperator):
    """Move a pipeline's cursors from the offsets DAG's params, as `ledgerbatch offsets --set` does (ops/offsets.py);
    returns the moves as one line (airflow/outcomes.py).

    :param request: The offsets DAG's params (to: time, offset, earliest or latest; to_time or to_offset; topic,
        partitions, by, reason, dry_run), as a dict or its JSON (templated).
    """

    template_fields = (*LedgerbatchBaseOperator.template_fields, "request")

    def __init__(self, *, request: dict | str, **kwargs: Any):
        super().__init__(**kwargs)
        self.request = request

    def execute(self, context) -> str:
        from ledgerbatch.airflow.forms import move_request
        from ledgerbatch.ops.offsets import set_offsets

        engine, spec = self._engine_and_spec()
        params = json.loads(self.request) if isinstance(self.request, str) else self.request
        with refused(self.dag_id):
            ask = move_request(params)
            moves = set_offsets(engine, spec, self.kafka_hook.get_bootstrap_servers(), ask.target, ask.by,
                                ask.reason, ask.topic, ask.partitions, ask.dry_run)
        line = moves_line(spec.name, ask.dry_run, ask.target, moves)
        self.log.info("%s", line)
        return line


class ProcessBatchOperator(LedgerbatchBaseOperator, SparkSubmitOperator):
    """Stage one batch; a retry re-runs the same pinned ranges under a new attempt.

    Where a Spark Connect server is named (the `spark_connect_conn_id` connection, else
    LEDGERBATCH_SPARK_REMOTE; see hooks.spark_connect_url), the task processes the batch itself, through a
    Spark Connect session on that server: no new JVM, Spark stays warm between DAG runs. Otherwise it
    spark-submits spark_jobs/process_batch.py (the default, for clusters).

    :param batch_id: The batch to process, usually the plan task's XCom (templated). It becomes the job's
        `--batch-id` argument at execute time.
    :param spark_connect_conn_id: The `spark_connect` connection of a Spark Connect server, defaults to
        "spark_connect_default"; absent (and LEDGERBATCH_SPARK_REMOTE unset), spark-submit.
    :param kubernetes_secret: With a `k8s://` master in cluster deploy mode: the Kubernetes secret (keys
        db-url, kafka-options, schema-registry, and staging-db-url where the worker has
        LEDGERBATCH_STAGING_DB_URL; docs/cluster.md) the driver reads its secret settings from,
        defaults to the worker's LEDGERBATCH_KUBERNETES_SECRET (what the factory's DAGs use).

    The database URLs (the ledger's and the stager's) and the Kafka and registry settings never go on
    spark-submit's command line or into the job's environment (on YARN and Kubernetes the provider makes
    `--conf` arguments of it): the job
    reads them from a file only this user can read (spark/settings_file.py), removed when the job ends,
    or on a Kubernetes cluster from `kubernetes_secret`.

    The other arguments go to SparkSubmitOperator (`conn_id` defaults to "spark_default"); `application`,
    `name` and `application_args` are set here.
    """

    template_fields = (*SparkSubmitOperator.template_fields, *LedgerbatchBaseOperator.template_fields, "batch_id")

    def __init__(self, *, pipeline: str, batch_id: str, spark_connect_conn_id: str = SPARK_CONNECT_CONN_ID,
                 kubernetes_secret: str | None = None, **kwargs: Any):
        kwargs.setdefault("conn_id", "spark_default")
        super().__init__(pipeline=pipeline, application=str(SPARK_JOB), name=f"ledgerbatch-{pipeline}", **kwargs)
        self.batch_id = batch_id
        self.spark_connect_conn_id = spark_connect_conn_id
        self.kubernetes_secret = kubernetes_secret
        self._shipped: str | None = None  # the settings file prepare_submit last added to `files`

    def job_env(self, settings: Settings) -> dict[str, str]:
        """The spark-submit job's environment: the settings the CLI reads that carry no secret (those go
        by prepare_submit's file)."""
        bindir = str(Path(sys.executable).parent)
        return {
            **(self.env_vars or {}),
            "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "LEDGERBATCH_PIPELINES_DIR": self.pipelines_dir,
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            # pip's spark-submit finds SPARK_HOME through the python first on PATH
            "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        }

    def execute(self, context) -> None:
        started = time.monotonic()
        remote = spark_connect_url(self.spark_connect_conn_id)
        if remote:
            self._process_on_connect(remote)
        else:
            with tempfile.TemporaryDirectory(prefix="ledgerbatch-job-") as private:  # mode 0700, removed after
                self.prepare_submit(self.settings, Path(private))
                super().execute(context)
        self._phase_event("process", int(self.batch_id), started)

    def prepare_submit(self, settings: Settings, private: Path) -> None:
        """The job's environment, arguments, files and properties: its secret settings in a file in
        `private` (the driver runs beside spark-submit, or on a YARN cluster, which gets it by --files), or
        on a Kubernetes cluster from the secret `kubernetes_secret`; never argv."""
        # The provider resolves master and deploy mode (operator argument over connection) in its hook.
        connection = self._get_hook()._connection
        self._hook = None  # SparkSubmitOperator.execute builds it anew, with this try's file (not a retry's last)
        self.env_vars = self.job_env(settings)
        if connection["master"].startswith("local"):  # its UI and driver ports on loopback (spark/session.py)
            self.env_vars["SPARK_LOCAL_IP"] = os.environ.get("SPARK_LOCAL_IP") or "127.0.0.1"
        self.application_args = ["--pipeline", self.pipeline, "--batch-id", str(self.batch_id)]
        # The worker's stager login (config.staging_db_url) goes with the other secrets: a cluster driver does
        # not inherit the worker's environment, and would stage with the ledger's login.
        staging = os.environ.get(STAGING_DB_URL)
        if connection["deploy_mode"] == "cluster" and "k8s" in connection["master"]:
            secret = self.kubernetes_secret or os.environ.get("LEDGERBATCH_KUBERNETES_SECRET")
            if not secret:
                raise AirflowFailException(
                    f"{connection['master']} in cluster deploy mode: the driver runs in a pod and gets the database "
                    f"URL and the Kafka and registry settings from a Kubernetes secret, never from spark-submit's "
                    f"command line; create one (keys db-url, kafka-options, schema-registry, and staging-db-url with "
                    f"{STAGING_DB_URL} set here; docs/cluster.md) and "
                    f"name it in ProcessBatchOperator(kubernetes_secret=...) or LEDGERBATCH_KUBERNETES_SECRET")
            self.conf = {**(self.conf or {}), **kubernetes_secret_refs(secret, staging=bool(staging))}
            return
        path = write_settings_file(private, settings, staging)
        self.application_args += ["--settings-file", str(path)]
        if connection["deploy_mode"] == "cluster":  # this try's file only: a reused operator's last one is gone
            files = [f for f in (self.files or "").split(",") if f and f != self._shipped]
            self.files, self._shipped = ",".join([*files, str(path)]), str(path)

    def _process_on_connect(self, remote: str) -> None:
        """What spark_jobs/process_batch.py does, in this task, on a session of the Spark Connect server."""
        from ledgerbatch.ledger.batches import get_batch
        from ledgerbatch.model.batch import BatchKind
        from ledgerbatch.spark.connect import connect_spark
        from ledgerbatch.stage.process import process_batch

        engine, spec = self._engine_and_spec()
        settings = self.settings
        self.log.info("batch %s: processing on the Spark Connect server %s", self.batch_id,
                      remote.split(";")[0])  # user id and token stay out of the log
        # A live batch runs in the pipeline's kept session, warm from its last run; a replay in its own (connect.py).
        with engine.connect() as conn:
            live = get_batch(conn, int(self.batch_id)).kind == BatchKind.LIVE
        keep = f"live:{spec.name}" if live else None
        with connect_spark(remote, f"ledgerbatch-{spec.name}-batch-{self.batch_id}", keep) as spark:
            process_batch(spark, engine, spec, int(self.batch_id), settings.db_url, settings.bootstrap_servers)


class ReviewBatchOperator(LedgerbatchBaseOperator, ApprovalOperator):
    """The backfill DAG's approval step (Airflow's human-in-the-loop, 3.1+). With `approve`, it shows the
    staged replay's diff against the target in Airflow's Required actions and waits for a person:
    Approve, and `commit` goes on; Reject, and the batch is abandoned (commit and verify are skipped).
    Without `approve` it passes at once.

    :param batch_id: The staged batch, usually the plan task's XCom (templated).
    :param approve: Wait for a person: a bool, or a string "true"/"1" (templated).
    """

    template_fields = (*ApprovalOperator.template_fields, *LedgerbatchBaseOperator.template_fields, "batch_id",
                       "approve")

    def __init__(self, *, batch_id: str, approve: bool | str = False, **kwargs: Any):
        super().__init__(subject="Commit this replay?", **kwargs)
        self.batch_id = batch_id
        self.approve = approve

    def execute(self, context):
        from ledgerbatch.commit.diff import staged_diff
        from ledgerbatch.ledger.batches import get_batch

        if str(self.approve).lower() not in ("true", "1"):
            self.log.info("batch %s: no approval asked for", self.batch_id)
            return None
        engine, spec = self._engine_and_spec()
        diff = staged_diff(engine, spec, int(self.batch_id))
        with engine.connect() as conn:
            batch = get_batch(conn, int(self.batch_id))
        self.subject = f"Commit {batch.kind} batch {batch.batch_id} of {spec.name}?"
        self.body = (f"Committing replaces the target rows of these source coordinates in "
                     f"`{spec.target_schema}.{spec.target_table}` in one transaction:\n\n"
                     + "\n".join(f"- `{r}`" for r in batch.ranges)
                     + "\n\n| rows added | removed | changed | unchanged | bad records |\n| ---: | ---: | ---: | ---: | ---: |\n"
                     + f"| {diff.added} | {diff.removed} | {diff.changed} | {diff.unchanged} | {diff.quarantined} |\n\n"
                     "Reject abandons the batch: the target stays as it is.")
        self.log.info("batch %s waits for approval: %s", self.batch_id, diff)
        return super().execute(context)

    def execute_complete(self, context, event: dict[str, Any]) -> Any:
        from ledgerbatch.ops.abandon import abandon_batch

        if event.get("chosen_options") == [self.REJECT]:  # before super() skips commit and verify
            engine, spec = self._engine_and_spec()
            by = (event.get("responded_by_user") or {}).get("name") or "a reviewer"
            abandon_batch(engine, spec, int(self.batch_id), by, "rejected in the backfill DAG's review")
        return super().execute_complete(context, event)


class CommitBatchOperator(LedgerbatchBaseOperator):
    """The one commit transaction; a retry after a commit that succeeded is a no-op.
    With `dry_run`, report the staged rows' diff against the target and abandon the batch instead.

    Asset events: only a batch committed by this task (not an already committed one, not a dry run) makes
    one, on every outlet: an `Asset` outlet (the pipeline DAGs declare their target's) gets the batch as
    the event's extra (`asset_extra`); an `AssetAlias` outlet (the backfill DAG's, whose pipeline is only
    known at run time) gets an event for the pipeline's target Asset with that extra. Otherwise the outlets
    are dropped for this try, so Airflow records no event.

    :param batch_id: The batch to commit, usually the plan task's XCom (templated).
    :param dry_run: Report the diff and abandon the batch instead of committing: a bool, or a string
        "true"/"1" (templated).
    """

    template_fields = (*LedgerbatchBaseOperator.template_fields, "batch_id", "dry_run")

    def __init__(self, *, batch_id: str, dry_run: bool | str = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.batch_id = batch_id
        self.dry_run = dry_run
        self._rows_written: int | None = None  # of this try's commit, for the lineage of its completion

    def get_openlineage_facets_on_start(self):
        """The OpenLineage provider's START: the topics in, the target out (ops/lineage.py)."""
        return self._lineage()

    def get_openlineage_facets_on_complete(self, task_instance):
        """COMPLETE: the same, with the rows this commit wrote and the batch's ranges."""
        return self._lineage(self._rows_written)

    def _lineage(self, rows_written: int | None = None):
        from airflow.providers.openlineage.extractors import OperatorLineage

        from ledgerbatch.ledger.batches import get_batch
        from ledgerbatch.ops.lineage import BATCH_FACET, batch_facet, datasets

        if str(self.dry_run).lower() in ("true", "1"):
            return OperatorLineage()  # a dry run delivers nothing
        engine, spec = self._engine_and_spec()
        with engine.connect() as conn:
            batch = get_batch(conn, int(self.batch_id))
        inputs, outputs = datasets(spec, self.ledger_hook.get_url(), self.kafka_hook.get_bootstrap_servers(), batch,
                                   rows_written)
        return OperatorLineage(inputs=inputs, outputs=outputs, run_facets={BATCH_FACET: batch_facet(batch)})

    def execute(self, context) -> str:
        from ledgerbatch.commit.diff import dry_run_diff
        from ledgerbatch.commit.modes.rollup import bound_partitions
        from ledgerbatch.commit.transaction import commit_batch
        from ledgerbatch.ledger.batches import get_batch

        engine, spec = self._engine_and_spec()
        if str(self.dry_run).lower() in ("true", "1"):
            diff = dry_run_diff(engine, spec, int(self.batch_id))  # which logs the diff
            self.outlets = []  # nothing was published: no asset event
            with engine.connect() as conn:
                line = dry_run_line(get_batch(conn, int(self.batch_id)), diff)
            self.log.info("%s", line)
            return line
        started = time.monotonic()
        result = commit_batch(engine, spec, int(self.batch_id))
        bound_partitions(engine, spec)  # as `run` does after each commit (commit/modes/rollup.py)
        record_lag(engine, spec, self.kafka_hook.get_bootstrap_servers(), in_airflow=True)
        self._rows_written = result.rows_written
        self._phase_event("commit", int(self.batch_id), started, rows_written=result.rows_written,
                          rows_quarantined=result.rows_quarantined, committed_now=not result.already_committed,
                          rows_rejected=result.rows_rejected)
        with engine.connect() as conn:
            line = commit_line(get_batch(conn, int(self.batch_id)), f"{spec.target_schema}.{spec.target_table}",
                               result)
        self.log.info("%s", line)
        if result.already_committed:
            self.outlets = []  # its event was recorded by the try that committed it
        else:
            self._publish(context, spec)
        return line

    def _publish(self, context, spec: PipelineSpec) -> None:
        """The committed batch as the extra of this task's asset events."""
        from airflow.sdk import Asset, AssetAlias

        from ledgerbatch.ledger.batches import get_batch

        with self.ledger_hook.get_engine().connect() as conn:
            batch = get_batch(conn, int(self.batch_id))
        extra = asset_extra(spec, batch)
        for outlet in self.outlets:
            if isinstance(outlet, Asset):
                context["outlet_events"][outlet].extra = extra
            elif isinstance(outlet, AssetAlias):
                target = Asset(self.ledger_hook.get_asset_uri(spec.target_schema, spec.target_table),
                               group=ASSET_GROUP)
                context["outlet_events"][outlet].add(target, extra=extra)
        self.log.info("asset event extra: %s, ranges: %s",  # the ranges in one short line, not a long JSON list
                      json.dumps({k: v for k, v in extra.items() if k != "ranges"}), compact_ranges(batch.ranges))


ASSET_GROUP = "ledgerbatch"  # the targets' Assets and the new-data ones, side by side in the Assets view


def asset_extra(spec: PipelineSpec, batch) -> dict:
    """What a downstream DAG learns from a commit's asset event: the batch, its ranges and its counts."""
    return {
        "pipeline": spec.name,
        "target": f"{spec.target_schema}.{spec.target_table}",
        "batch_id": batch.batch_id,
        "kind": str(batch.kind),
        "attempt": batch.attempt,
        "ranges": [{"topic": r.topic, "partition": r.partition, "from_offset": r.from_offset,
                    "until_offset": r.until_offset} for r in batch.ranges],
        "records_read": batch.records_read,
        "records_filtered": batch.records_filtered,
        "rows_written": batch.rows_written,
        "rows_quarantined": batch.rows_quarantined,
    }


class UpkeepOperator(LedgerbatchBaseOperator):
    """Keep a pipeline's history bounded (ops/history.py): what its spec asks for (history.compact_after,
    errors.quarantine_retention, the partition bound), and with `compact_before` / `purge_before` (ISO-8601
    or an age such as 30d; templated, empty: none) a compaction or purge asked for by hand; with `dry_run`
    (templated) only the count `purge_before` would drop, nothing changed. Returns its counts as one line."""

    template_fields = (*LedgerbatchBaseOperator.template_fields, "compact_before", "purge_before", "dry_run")

    def __init__(self, *, compact_before: str | None = None, purge_before: str | None = None,
                 dry_run: bool | str = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.compact_before, self.purge_before, self.dry_run = compact_before, purge_before, dry_run

    def execute(self, context) -> str:
        from ledgerbatch.airflow.forms import history_request
        from ledgerbatch.ops.history import compact, purge_quarantine, upkeep
        from ledgerbatch.ops.purge_preview import purge_count

        engine, spec = self._engine_and_spec()
        with refused(self.dag_id):
            compact_before, purge_before, dry_run = history_request(self.compact_before, self.purge_before,
                                                                    self.dry_run)
        if dry_run:
            line = (f"dry run of {spec.name}'s purge: {purge_count(engine, spec, purge_before)} quarantined "
                    f"records before {purge_before.isoformat(timespec='seconds')} would be purged; nothing changed")
            self.log.info("%s", line)
            return line
        counts = {"batches_compacted": 0, "quarantine_purged": 0}
        if compact_before:
            counts["batches_compacted"] += compact(engine, spec, compact_before).batches
        if purge_before:
            counts["quarantine_purged"] += purge_quarantine(engine, spec, purge_before)
        done = upkeep(engine, spec)
        counts["batches_compacted"] += done.compacted.batches if done.compacted else 0
        counts["quarantine_purged"] += done.purged or 0
        counts["partition_rollups"] = len(done.rollups)
        line = upkeep_line(spec.name, counts)
        self.log.info("%s", line)
        return line


class VerifyOperator(LedgerbatchBaseOperator):
    """`ledgerbatch verify`: fails (without retrying) naming each violated invariant."""

    def execute(self, context) -> None:
        from ledgerbatch.ops.verify import verify

        engine, spec = self._engine_and_spec()
        problems = verify(engine, spec)
        for problem in problems:
            self.log.error("VIOLATION %s: %s", self.pipeline, problem)
        if problems:
            raise AirflowFailException(f"{len(problems)} invariant violations in {self.pipeline}: {problems[0]}")
        self.log.info("%s: all invariants hold", self.pipeline)

"""Operators: thin adapters over the ledgerbatch package. Every one is safe to retry at any point:
the ledger, not Airflow, decides what is planned, staged and committed."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from airflow.sdk.observability.stats import Stats

from ..config import REPO_ROOT
from ..events import phase_event
from .hooks import settings_from_connections

SPARK_JOB = REPO_ROOT / "spark_jobs" / "process_batch.py"


class _LedgerbatchMixin:
    def _init_settings(self, pipeline: str, pipelines_dir: str, ledger_conn_id: str, kafka_conn_id: str) -> None:
        self.pipeline = pipeline
        self.pipelines_dir = str(pipelines_dir)
        self.ledger_conn_id = ledger_conn_id
        self.kafka_conn_id = kafka_conn_id

    def _settings(self):
        return settings_from_connections(self.ledger_conn_id, self.kafka_conn_id, Path(self.pipelines_dir))

    def _engine_and_spec(self):
        from ..db import make_engine

        settings = self._settings()
        return settings, make_engine(settings.db_url), settings.spec(self.pipeline)

    def _phase_event(self, phase: str, engine, batch_id: int, started: float, **counts) -> None:
        """The phase's event line and metrics, through Airflow's Stats (the deployment's [metrics] settings)."""
        from .. import ledger

        with engine.connect() as conn:
            batch = ledger.get_batch(conn, batch_id)
        phase_event(phase, batch, time.monotonic() - started, stats=Stats, **counts)


class PlanBatchOperator(_LedgerbatchMixin, ShortCircuitOperator):
    """Resume the unfinished live batch or plan the next one; returns its id. Nothing new: downstream is skipped."""

    template_fields = (*ShortCircuitOperator.template_fields, "pipeline")

    def __init__(self, *, pipeline: str, pipelines_dir: str, ledger_conn_id: str = "ledgerbatch_db",
                 kafka_conn_id: str = "ledgerbatch_kafka", **kwargs: Any):
        self._init_settings(pipeline, pipelines_dir, ledger_conn_id, kafka_conn_id)
        super().__init__(python_callable=self._plan, **kwargs)

    def _plan(self) -> int | None:
        from ..planner import plan_next

        settings, engine, spec = self._engine_and_spec()
        started = time.monotonic()
        batch = plan_next(engine, spec, settings.bootstrap_servers)
        if batch is None:
            self.log.info("%s is caught up: no batch to run", self.pipeline)
            return None
        phase_event("plan", batch, time.monotonic() - started, stats=Stats)
        self.log.info("batch %d (%s): %d offsets in %d ranges", batch.batch_id, batch.status, batch.span, len(batch.ranges))
        return batch.batch_id


class PlanReplayOperator(_LedgerbatchMixin, BaseOperator):
    """Plan a replay or backfill batch from the backfill DAG's params; returns its id."""

    template_fields = ("pipeline", "request")

    def __init__(self, *, pipeline: str, request: dict | str, pipelines_dir: str, ledger_conn_id: str = "ledgerbatch_db",
                 kafka_conn_id: str = "ledgerbatch_kafka", **kwargs: Any):
        super().__init__(**kwargs)
        self._init_settings(pipeline, pipelines_dir, ledger_conn_id, kafka_conn_id)
        self.request = request

    def execute(self, context) -> int:
        from ..replay import plan_replay, request_from_params, resolve_ranges

        settings, engine, spec = self._engine_and_spec()
        params = json.loads(self.request) if isinstance(self.request, str) else self.request
        started = time.monotonic()
        ranges = resolve_ranges(spec, settings.bootstrap_servers, request_from_params(spec, params))
        batch = plan_replay(engine, spec, ranges)
        phase_event("plan", batch, time.monotonic() - started, stats=Stats)
        self.log.info("%s batch %d: %s", batch.kind, batch.batch_id, ", ".join(map(str, batch.ranges)))
        return batch.batch_id


class ProcessBatchOperator(_LedgerbatchMixin, SparkSubmitOperator):
    """spark-submit spark_jobs/process_batch.py for one batch; a retry re-runs the same pinned ranges."""

    def __init__(self, *, pipeline: str, batch_id: str, pipelines_dir: str, ledger_conn_id: str = "ledgerbatch_db",
                 kafka_conn_id: str = "ledgerbatch_kafka", **kwargs: Any):
        kwargs.setdefault("conn_id", "spark_default")
        super().__init__(application=str(SPARK_JOB), name=f"ledgerbatch-{pipeline}",
                         application_args=["--pipeline", pipeline, "--batch-id", batch_id], **kwargs)
        self._init_settings(pipeline, pipelines_dir, ledger_conn_id, kafka_conn_id)

    def job_env(self, settings) -> dict[str, str]:
        """The spark-submit job's environment: the same settings the CLI reads, from the connections
        (Kafka security settings travel in LEDGERBATCH_KAFKA_OPTIONS to the driver and its readers)."""
        bindir = str(Path(sys.executable).parent)
        return {
            **(self.env_vars or {}),
            "LEDGERBATCH_DB_URL": settings.db_url,
            "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "LEDGERBATCH_KAFKA_OPTIONS": json.dumps(settings.kafka_options),
            "LEDGERBATCH_PIPELINES_DIR": self.pipelines_dir,
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            # pip's spark-submit finds SPARK_HOME through the python first on PATH
            "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        }

    def execute(self, context) -> None:
        from ..db import make_engine

        settings = self._settings()
        self.env_vars = self.job_env(settings)
        started = time.monotonic()
        super().execute(context)
        batch_id = int(self.application_args[-1])  # the rendered template of --batch-id
        self._phase_event("process", make_engine(settings.db_url), batch_id, started)


class CommitBatchOperator(_LedgerbatchMixin, BaseOperator):
    """The one commit transaction; a retry after a commit that succeeded is a no-op.
    With `dry_run`, report the staged rows' diff against the target and abandon the batch instead."""

    template_fields = ("pipeline", "batch_id", "dry_run")

    def __init__(self, *, pipeline: str, batch_id: str, pipelines_dir: str, dry_run: bool | str = False,
                 ledger_conn_id: str = "ledgerbatch_db", kafka_conn_id: str = "ledgerbatch_kafka", **kwargs: Any):
        super().__init__(**kwargs)
        self._init_settings(pipeline, pipelines_dir, ledger_conn_id, kafka_conn_id)
        self.batch_id = batch_id
        self.dry_run = dry_run

    def execute(self, context) -> dict:
        from ..commit import commit_batch
        from ..replay import dry_run_diff

        _, engine, spec = self._engine_and_spec()
        if str(self.dry_run).lower() in ("true", "1"):
            diff = dry_run_diff(engine, spec, int(self.batch_id))
            self.log.info("dry run of batch %s, target unchanged: %s", self.batch_id, diff)
            return {"dry_run": True, **diff.__dict__}
        started = time.monotonic()
        result = commit_batch(engine, spec, int(self.batch_id))
        self._phase_event("commit", engine, int(self.batch_id), started, rows_written=result.rows_written,
                          rows_quarantined=result.rows_quarantined, committed_now=not result.already_committed)
        self.log.info("batch %s %s: %d rows written, %d quarantined", self.batch_id,
                      "was already committed" if result.already_committed else "committed",
                      result.rows_written, result.rows_quarantined)
        return {"dry_run": False, "already_committed": result.already_committed,
                "rows_written": result.rows_written, "rows_quarantined": result.rows_quarantined}


class VerifyOperator(_LedgerbatchMixin, BaseOperator):
    """`ledgerbatch verify`: fails (without retrying) naming each violated invariant."""

    template_fields = ("pipeline",)

    def __init__(self, *, pipeline: str, pipelines_dir: str, ledger_conn_id: str = "ledgerbatch_db",
                 kafka_conn_id: str = "ledgerbatch_kafka", **kwargs: Any):
        super().__init__(**kwargs)
        self._init_settings(pipeline, pipelines_dir, ledger_conn_id, kafka_conn_id)

    def execute(self, context) -> None:
        from ..verify import verify

        _, engine, spec = self._engine_and_spec()
        problems = verify(engine, spec)
        for problem in problems:
            self.log.error("VIOLATION %s: %s", self.pipeline, problem)
        if problems:
            raise AirflowFailException(f"{len(problems)} invariant violations in {self.pipeline}: {problems[0]}")
        self.log.info("%s: all invariants hold", self.pipeline)


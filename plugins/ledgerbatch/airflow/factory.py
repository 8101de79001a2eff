"""DAG factory: one DAG per pipeline spec (`ledgerbatch_<name>`), and the manual `ledgerbatch_backfill` DAG."""
from __future__ import annotations

import logging
import os
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import DAG, Param

from ..config import REPO_ROOT
from ..errors import SpecError
from ..spec import PipelineSpec, parse_spec_file
from .operators import (CommitBatchOperator, PlanBatchOperator, PlanReplayOperator, ProcessBatchOperator,
                        VerifyOperator)

log = logging.getLogger(__name__)

DEFAULT_SCHEDULE = "*/15 * * * *"  # a spec's `schedule:` overrides it
START = pendulum.datetime(2026, 1, 1, tz="UTC")
BATCH_ID = "{{ ti.xcom_pull(task_ids='plan') }}"
DEFAULT_ARGS = {
    "owner": "ledgerbatch",
    "retries": 3,
    "retry_delay": timedelta(seconds=20),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=10),
}
TASK_DOCS = {
    "plan": "Resume the pipeline's unfinished batch with its pinned ranges, or record the next batch "
            "(one range per partition, from the cursors to the read_committed end offsets). Nothing new: "
            "this task succeeds and the rest of the run is skipped.",
    "process": "spark-submit `spark_jobs/process_batch.py`: read exactly the batch's ranges, parse, quarantine "
               "bad records, COPY into this attempt's staging table; the batch becomes `staged`. A retry starts "
               "a new attempt over the same ranges and fences the old one.",
    "commit": "One PostgreSQL transaction: compare-and-set the cursors, reconcile counts, move staged rows into "
              "the target. Already committed: no-op.",
    "verify": "`ledgerbatch verify`: committed ranges tile the log, counts reconcile, no duplicate coordinates, "
              "no orphan staging tables.",
}


def pipelines_dir() -> Path:
    return Path(os.environ.get("LEDGERBATCH_PIPELINES_DIR") or REPO_ROOT / "pipelines").resolve()


def load_specs(directory: Path) -> list[PipelineSpec]:
    """Valid specs; an invalid one is logged and left out so that it cannot take the other DAGs down."""
    specs = []
    for path in sorted(directory.glob("*.yaml")):
        try:
            specs.append(parse_spec_file(path))
        except SpecError as exc:
            log.error("ledgerbatch: skipping pipeline spec: %s", exc)
    return specs


def pipeline_dag(spec: PipelineSpec, directory: Path) -> DAG:
    common = dict(pipeline=spec.name, pipelines_dir=str(directory))
    with DAG(
        dag_id=f"ledgerbatch_{spec.name}",
        schedule=spec.schedule or DEFAULT_SCHEDULE,
        start_date=START,
        catchup=False,  # the ledger, not data intervals, decides what is new
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        tags=["ledgerbatch", f"pipeline:{spec.name}"],
        doc_md=f"Exactly-once delivery of {', '.join(spec.topics)} into "
               f"`{spec.target_schema}.{spec.target_table}` ({spec.mode}), at most {spec.max_records} "
               f"offsets per batch. Spec: `{directory / (spec.name + '.yaml')}`.",
    ) as dag:
        plan = PlanBatchOperator(task_id="plan", doc_md=TASK_DOCS["plan"], **common)
        process = ProcessBatchOperator(task_id="process", batch_id=BATCH_ID, doc_md=TASK_DOCS["process"], **common)
        commit = CommitBatchOperator(task_id="commit", batch_id=BATCH_ID, doc_md=TASK_DOCS["commit"], **common)
        verify = VerifyOperator(task_id="verify", doc_md=TASK_DOCS["verify"], retries=0, **common)
        plan >> process >> commit >> verify
    return dag


def backfill_dag(specs: list[PipelineSpec], directory: Path) -> DAG:
    names = [s.name for s in specs] or ["(no pipelines)"]
    common = dict(pipeline="{{ params.pipeline }}", pipelines_dir=str(directory))
    with DAG(
        dag_id="ledgerbatch_backfill",
        schedule=None,
        start_date=START,
        catchup=False,
        default_args={**DEFAULT_ARGS, "retries": 1},
        tags=["ledgerbatch", "backfill"],
        doc_md="Re-read an explicit range of a pipeline's topic. A range its batches already delivered is a "
               "**replay**: exactly the target rows (and quarantined records) of those source coordinates are "
               "replaced in one transaction. A range before the pipeline's start offset is a **backfill**. The "
               "live cursors never move. `dry_run` stages the result and reports the row diff without changing "
               "the target. Everything is recorded in `ledger.batches` (kind replay/backfill).",
        params={
            "pipeline": Param(names[0], enum=names, description="Pipeline spec to replay."),
            "topic": Param("", type="string", description="Topic; empty: the pipeline's only topic."),
            "partitions": Param([], type="array", items={"type": "integer", "minimum": 0},
                                description="Partitions; empty: all."),
            "from_offset": Param(None, type=["null", "integer"], minimum=0, description="First offset (inclusive)."),
            "until_offset": Param(None, type=["null", "integer"], minimum=1, description="End offset (exclusive)."),
            "from_time": Param(None, type=["null", "string"], description="Or a time window: ISO-8601 start "
                               "(resolved to offsets by the broker, where it supports timestamp look-ups)."),
            "until_time": Param(None, type=["null", "string"], description="ISO-8601 end of the time window."),
            "dry_run": Param(True, type="boolean", description="Stage and report the diff only."),
        },
    ) as dag:
        plan = PlanReplayOperator(task_id="plan", request="{{ params | tojson }}",
                                  doc_md="Resolve the request to offset ranges and record a replay/backfill batch.",
                                  **common)
        process = ProcessBatchOperator(task_id="process", batch_id=BATCH_ID, doc_md=TASK_DOCS["process"], **common)
        commit = CommitBatchOperator(task_id="commit", batch_id=BATCH_ID, dry_run="{{ params.dry_run }}",
                                     doc_md="Replace the target rows of the replayed coordinates in one "
                                            "transaction, or with dry_run report the diff and abandon the batch.",
                                     **common)
        verify = VerifyOperator(task_id="verify", doc_md=TASK_DOCS["verify"], retries=0, **common)
        plan >> process >> commit >> verify
    return dag


def build_dags(directory: Path | None = None) -> dict[str, DAG]:
    directory = directory or pipelines_dir()
    specs = load_specs(directory)
    dags = {f"ledgerbatch_{s.name}": pipeline_dag(s, directory) for s in specs}
    dags["ledgerbatch_backfill"] = backfill_dag(specs, directory)
    return dags

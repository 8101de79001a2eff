"""SQL that travels to Spark tasks as text: rendered on the driver from sql/ (executors, and the
Python worker that runs a writer's commit, may have only the package's code), plain data here so
that unpickling it needs no database library."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StagingStatements:
    """A staging task's statements (psycopg2 parameters, sql/queries/staging_tasks.sql)."""
    lock: str
    delete: str
    copy: str
    copy_bad: str
    # query pipelines: bad records and read counts are staged before the query, its output after
    delete_bad: str = ""
    record_read: str = ""
    copy_output: str = ""


@dataclass(frozen=True)
class StagedMarkStatements:
    """Recording a staged attempt (ledger/batches.py: mark_staged, staged_reads)."""
    mark: str
    set_count: str
    reads: str
    # change pipelines: deletes and skipped records among the staged rows (ledger/batches.py: mark_staged)
    mark_changes: str = ""
    set_range_changes: str = ""

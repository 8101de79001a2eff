"""SQL that travels to Spark tasks as text: rendered on the driver from sql/ (executors may have only the
package's code), plain data here so that unpickling it needs no database library."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StagingStatements:
    """A staging task's statements (psycopg2 parameters, sql/queries/staging_tasks.sql)."""
    session: str
    lock: str
    delete: str
    copy: str
    copy_bad: str
    # query pipelines: bad records and read counts are staged before the query, its output after
    delete_bad: str = ""
    record_read: str = ""
    copy_output: str = ""

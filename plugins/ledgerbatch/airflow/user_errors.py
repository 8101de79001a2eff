"""A person's mistake, answered in the UI's words: one line, at once, without retries.

The package refuses a request with a plain LedgerbatchError (or its FieldError and DeliveredAgain), worded
for the CLI. Raised from a DAG's task, `refused` turns it into an AirflowFailException (no retry: trying
again cannot fix a value the form sent) whose one line names the DAG and what to fill in, and drops the
package's traceback (the line says it all). Every other error (a broker down, a fenced attempt, counts that
do not reconcile) passes untouched: the task's retries are for those."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from airflow.sdk.exceptions import AirflowFailException

from ledgerbatch.errors import BatchOpen, DeliveredAgain, FieldError, LedgerbatchError

log = logging.getLogger(__name__)
BACKFILL_DAG = "ledgerbatch_backfill"


def is_users_mistake(exc: BaseException) -> bool:
    """A refusal of what was asked, not a failure of the system: the plain base class, or its request kinds."""
    return type(exc) is LedgerbatchError or isinstance(exc, (FieldError, DeliveredAgain, BatchOpen))


def ui_line(dag_id: str, exc: LedgerbatchError) -> str:
    """The one line a person reads in the UI."""
    if isinstance(exc, DeliveredAgain):
        return (f"{dag_id}: {exc.topic}[{exc.partition}] back from {exc.until_offset} to {exc.from_offset} would "
                f"deliver {exc.delivered} offsets again that batches delivered; re-deliver them with the "
                f"{BACKFILL_DAG} DAG instead: Pipeline {exc.pipeline}, Topic {exc.topic}, Partitions "
                f"{exc.partition}, From offset {exc.from_offset}, Until offset {exc.until_offset}")
    if isinstance(exc, BatchOpen):
        return (f"{dag_id}: batch {exc.batch_id} of {exc.pipeline} is open ({exc.status}) and its ranges start at "
                f"the cursors: let it finish (trigger the ledgerbatch_{exc.pipeline} DAG, or wait for its next run), "
                f"then move the offsets (a pipeline followed or scheduled often plans again at once: `ledgerbatch "
                f"pause {exc.pipeline}` first, `ledgerbatch resume {exc.pipeline}` after); to give the batch up "
                f"instead, `ledgerbatch abandon {exc.pipeline} {exc.batch_id} --by NAME` (no DAG does these)")
    return f"{dag_id}: {exc}"


@contextmanager
def refused(dag_id: str) -> Iterator[None]:
    """Inside it, a person's mistake fails the task at once with its one line (logged, then raised)."""
    try:
        yield
    except LedgerbatchError as exc:
        if not is_users_mistake(exc):
            raise
        line = ui_line(dag_id, exc)
        log.error("%s", line)
        raise AirflowFailException(line) from None

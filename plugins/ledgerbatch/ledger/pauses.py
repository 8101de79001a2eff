"""Pauses of pipelines in the ledger (ledger.pauses): who holds a pipeline still, since when and why; and
waits for batch.min_records (ledger.waits)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from ledgerbatch.ledger.sql import run


@dataclass(frozen=True)
class Pause:
    by: str
    reason: str
    since: dt.datetime

    def __str__(self) -> str:
        return f"paused by {self.by} since {self.since:%Y-%m-%d %H:%M:%S %Z} ({self.reason})"


def current_pause(conn: Connection, pipeline: str) -> Pause | None:
    row = run(conn, "current_pause", {"pipeline": pipeline}).first()
    return Pause(row.paused_by, row.reason, row.paused_at) if row else None


def insert_pause(conn: Connection, pipeline: str, by: str, reason: str) -> None:
    run(conn, "insert_pause", {"pipeline": pipeline, "by": by, "reason": reason})


def end_pause(conn: Connection, pipeline: str, by: str) -> Pause | None:
    """Resume: the pause that ended, or None when there was none."""
    row = run(conn, "end_pause", {"pipeline": pipeline, "by": by}).first()
    return Pause(row.paused_by, row.reason, row.paused_at) if row else None


def wait_age(conn: Connection, pipeline: str) -> float:
    """Seconds since the planner began holding back this pipeline's pending offsets (batch.min_records);
    0 when it begins now."""
    return run(conn, "wait_age", {"pipeline": pipeline}).scalar_one()


def end_wait(conn: Connection, pipeline: str) -> None:
    run(conn, "end_wait", {"pipeline": pipeline})

"""`ledgerbatch pause` / `resume`: hold a pipeline still and let it go again, recorded in the ledger.

A paused pipeline gets no new batch (plan/live.py); a batch already open may still finish, so a pause never
strands planned offsets. Its event-driven trigger stays quiet and its DAG runs end skipped.
"""
from __future__ import annotations

import logging

from sqlalchemy.engine import Engine

from ledgerbatch.errors import LedgerbatchError, require
from ledgerbatch.ledger.batches import lock_pipeline
from ledgerbatch.ledger.pauses import Pause, current_pause, end_pause, insert_pause
from ledgerbatch.spec.pipeline import PipelineSpec

log = logging.getLogger(__name__)


def pause_pipeline(engine: Engine, spec: PipelineSpec, by: str, reason: str) -> None:
    require(by, "who pauses the pipeline (--by NAME)")
    require(reason, "why (--reason TEXT)")
    with engine.begin() as conn:
        lock_pipeline(conn, spec.name)  # after a planner that is planning now, before the next
        pause = current_pause(conn, spec.name)
        if pause is not None:
            raise LedgerbatchError(f"{spec.name} is already {pause}")
        insert_pause(conn, spec.name, by.strip(), reason.strip())
    log.warning("%s: paused by %s (%s)", spec.name, by, reason)


def resume_pipeline(engine: Engine, spec: PipelineSpec, by: str) -> Pause:
    require(by, "who resumes the pipeline (--by NAME)")
    with engine.begin() as conn:
        lock_pipeline(conn, spec.name)
        pause = end_pause(conn, spec.name, by.strip())
    if pause is None:
        raise LedgerbatchError(f"{spec.name} is not paused: there is nothing to resume")
    log.warning("%s: resumed by %s (it was %s)", spec.name, by, pause)
    return pause


def pause_of(engine: Engine, spec: PipelineSpec) -> Pause | None:
    with engine.connect() as conn:
        return current_pause(conn, spec.name)


"""Target modes: how a batch's staged rows join the target, one module per `target.mode`.

The commit calls one strategy (as dbt's incremental materialization dispatches to one strategy
macro): `ensure_target` once, then `publish` inside the commit's transaction. A replay or backfill
batch (`batch.kind` not live) re-delivers ranges: the mode replaces what earlier deliveries of
them left in the target.
"""
from __future__ import annotations

from ..spec import PipelineSpec
from .aggregate import Aggregate
from .append import Append
from .base import TargetMode
from .upsert import Upsert

MODES: dict[str, TargetMode] = {"append": Append(), "upsert": Upsert(), "aggregate": Aggregate()}


def mode_for(spec: PipelineSpec) -> TargetMode:
    return MODES[spec.mode]

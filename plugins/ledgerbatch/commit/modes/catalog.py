"""Target modes: how a batch's staged rows join the target, one module per `target.mode` (base.py is
the interface).

The commit calls one strategy (as dbt's incremental materialization dispatches to one strategy
macro): `ensure_target` once, then `publish` inside the commit's transaction. A replay or backfill
batch (`batch.kind` not live) re-delivers ranges: the mode replaces what earlier deliveries of
them left in the target.
"""
from __future__ import annotations

from ledgerbatch.commit.modes.aggregate import Aggregate
from ledgerbatch.commit.modes.append import Append
from ledgerbatch.commit.modes.base import TargetMode
from ledgerbatch.commit.modes.upsert import Upsert
from ledgerbatch.commit.modes.versioned import VersionedUpsert
from ledgerbatch.spec.pipeline import PipelineSpec

MODES: dict[str, TargetMode] = {"append": Append(), "upsert": Upsert(), "aggregate": Aggregate()}


def mode_for(spec: PipelineSpec) -> TargetMode:
    return VersionedUpsert() if spec.version_by else MODES[spec.mode]

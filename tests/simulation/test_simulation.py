"""The simulation in CI: a fixed first seed (so a run is repeatable) for LEDGERBATCH_SIM_SECONDS (default 60);
every rule must have been drawn. Longer runs: `make simulate MINUTES=60` (docs/development.md)."""
from __future__ import annotations

import os

from .machine import Simulation
from .run import explore

RULES = {"produce", "retention", "live", "redeliver:replay", "redeliver:backfill", "redeliver:None", "abandon_open",
         "compact", "rollup", "purge", "skip_to_latest", "pause_or_resume", "user_ddl:check", "user_ddl:trigger",
         "user_ddl:key_index", "settle"}


def test_histories_agree_with_the_model(engine):
    Simulation.drawn.clear()
    failed = explore(engine, float(os.environ.get("LEDGERBATCH_SIM_SECONDS", "60")), first_seed=0)
    assert not failed
    assert RULES <= set(Simulation.drawn), f"rules never drawn: {sorted(RULES - set(Simulation.drawn))}"

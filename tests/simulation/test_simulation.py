"""The simulation in CI: a fixed first seed (so a run is repeatable) for LEDGERBATCH_SIM_SECONDS (default 60);
every rule must have been drawn. Longer runs: `make simulate MINUTES=60` (docs/development.md)."""
from __future__ import annotations

import os

from .machine import Simulation
from .run import explore

RULES = {"produce", "retention", "run", "live", "redeliver", "abandon_open", "compact",
         "rollup", "purge", "offsets", "caps", "error_budget", "pause_or_resume", "user_ddl", "tamper", "verify_deep",
         "interfere", "settle", "lose", "partition_bound",
         "interfere_upkeep", "quarantine_retention"}  # every rule, as it counts itself in Simulation.drawn (backfill_compacted as redeliver)
# Their variants (`redeliver:backfill`, `user_ddl:check`, `tamper:change:deep`, ...) are counted and printed: in
# 60 s (one round of ten histories at about 6 steps a second) not every variant comes up, every rule does.


def never_drawn(drawn) -> list[str]:
    """Rules not drawn; a rule drawn as `name:variant` counts."""
    return sorted(r for r in RULES if not any(d == r or d.startswith(r + ":") for d in drawn))


def test_histories_agree_with_the_model(engine):
    Simulation.drawn.clear()
    failed = explore(engine, float(os.environ.get("LEDGERBATCH_SIM_SECONDS", "60")), first_seed=0)
    print(f"steps by rule: {dict(sorted(Simulation.drawn.items()))}")
    assert not failed
    assert not never_drawn(Simulation.drawn), f"rules never drawn: {never_drawn(Simulation.drawn)}"

"""What a run does around its batches besides plan, stage and commit: its hooks.

`run_pipeline` (ops/run.py) reads as plan -> stage -> commit; everything else hangs off it here, one
collaborator per module: the warm-up of a follower's Spark (ops/warm_start.py), lag sampling for the
metrics (ops/lag_sampler.py), OpenLineage events (ops/lineage.py) and history upkeep with the partition
bound (ops/history.py). A hook implements the moments it cares about; the others do nothing.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Callable


class RunHook:
    def started(self, session: Callable) -> None:
        """The run begins; `session()` gives its Spark session (made on first call)."""

    def between_batches(self) -> None:
        """Before each plan, caught up or not."""

    @contextmanager
    def running(self, batch):
        """Around a batch's staging and commit (an error inside fails the batch)."""
        yield

    def committed(self, batch, result) -> None:
        """After the batch's commit (or its finding that the batch was already committed)."""

    def finished(self) -> None:
        """The run ends without an error."""


class Hooks(RunHook):
    """Several hooks as one, called in order (`running` nests them, the first outermost)."""

    def __init__(self, *hooks: RunHook):
        self.hooks = hooks

    def started(self, session: Callable) -> None:
        for hook in self.hooks:
            hook.started(session)

    def between_batches(self) -> None:
        for hook in self.hooks:
            hook.between_batches()

    @contextmanager
    def running(self, batch):
        with ExitStack() as stack:
            for hook in self.hooks:
                stack.enter_context(hook.running(batch))
            yield

    def committed(self, batch, result) -> None:
        for hook in self.hooks:
            hook.committed(batch, result)

    def finished(self) -> None:
        for hook in self.hooks:
            hook.finished()

"""A follower's hook that makes its Spark session warm before the first batch arrives (stage/warm_up.py)."""
from __future__ import annotations

import logging
from typing import Callable

from ledgerbatch.ops.hooks import RunHook
from ledgerbatch.spec.pipeline import PipelineSpec
from ledgerbatch.stage.warm_up import warm_up

log = logging.getLogger(__name__)


class WarmStart(RunHook):
    def __init__(self, spec: PipelineSpec, bootstrap_servers: str):
        self.spec, self.bootstrap_servers = spec, bootstrap_servers

    def started(self, session: Callable) -> None:
        warm = warm_up(session(), self.spec, self.bootstrap_servers)
        log.info("%s: Spark is up and its workers warm (%.1fs); following", self.spec.name, warm.seconds)

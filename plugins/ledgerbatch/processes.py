"""Stopping a child that runs in its own process group (a JVM with its Python workers, Airflow with its
scheduler and triggerer): everything in the group goes, not only the launcher."""
from __future__ import annotations

import os
import signal
import subprocess


def stop_group(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM the group of `proc` (started with start_new_session=True), wait up to `timeout` seconds for
    `proc`, then SIGKILL the group. A group that is already gone is fine."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue

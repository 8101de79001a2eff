"""Local child servers (a JVM with its Python workers, Airflow with its scheduler and triggerer, Kafka):
a free port for one, waiting until it listens, and stopping its process group, everything in the group,
not only the launcher."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time


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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, process: subprocess.Popen | None = None, timeout: float = 180,
                  what: str = "the server") -> None:
    """Until host:port accepts connections; raises RuntimeError if `process` exits first or the time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{what} did not listen on {host}:{port} within {timeout:.0f}s")

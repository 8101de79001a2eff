"""`ledgerbatch spark-server`: the pip wheel's own Spark Connect server (what Spark's sbin/start-connect-server.sh
runs, which the wheel lacks), in the foreground."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .processes import stop_group
from .sparksession import venv_first_on_path

CONNECT_PORT = 15002  # Spark Connect's default port
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"  # in the pip wheel's jars/
# A pipeline's kept session (connect.py) is ended by the server after this long idle; an hourly cron keeps it.
SESSION_IDLE_TIMEOUT = "2h"


def connect_server_command(port: int = CONNECT_PORT, host: str = "127.0.0.1", master: str = "local[*]",
                           log_level: str = "WARN") -> list[str]:
    """spark-submit of SparkConnectServer, listening on host:port."""
    bindir = Path(sys.executable).parent
    return [
        str(bindir / "spark-submit"), "--class", CONNECT_SERVER_CLASS, "--name", "ledgerbatch Spark Connect",
        "--master", master,
        "--conf", f"spark.connect.grpc.binding.address={host}",
        "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", f"spark.connect.session.manager.defaultSessionTimeout={SESSION_IDLE_TIMEOUT}",
        "--conf", "spark.sql.session.timeZone=UTC",
        "--conf", "spark.python.worker.reuse=true",
        "--conf", "spark.ui.showConsoleProgress=false",
        "--conf", f"spark.log.level={log_level}",
    ]


def connect_server_env() -> dict[str, str]:
    """The server's environment: the venv first on PATH (SPARK_HOME of the wheel), its Python for the workers."""
    venv_first_on_path()
    return {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}


def wait_for_port(host: str, port: int, process: subprocess.Popen | None = None, timeout: float = 180) -> None:
    """Until host:port accepts connections; raises if `process` exits first or the time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the Spark Connect server exited with code {process.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the Spark Connect server did not listen on {host}:{port} within {timeout:.0f}s")


def serve_connect(port: int = CONNECT_PORT, host: str = "127.0.0.1", master: str = "local[*]") -> int:
    """Run a local Spark Connect server in the foreground, print its sc:// URL once it listens, stop it (its
    whole process group: JVM and Python workers) on SIGTERM or Ctrl-C. Returns the server's exit code."""
    process = subprocess.Popen(connect_server_command(port, host, master), env=connect_server_env(),
                               start_new_session=True)
    signal.signal(signal.SIGTERM, lambda *_: stop_group(process, 30))
    try:
        wait_for_port(host, port, process)
        print(f"Spark Connect server: sc://{host}:{port} (master {master}); export LEDGERBATCH_SPARK_REMOTE=sc://{host}:{port}",
              flush=True)
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop_group(process, 30)

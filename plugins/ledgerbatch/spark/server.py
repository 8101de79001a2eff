"""The pip wheel's own Spark Connect server (what Spark's sbin/start-connect-server.sh runs, which the wheel
lacks): `ledgerbatch spark-server` in the foreground, or a child of the demo and the benchmark."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from ledgerbatch.processes import free_port, stop_group, wait_for_port
from ledgerbatch.spark.session import SECRET_VARIABLES, venv_first_on_path
from ledgerbatch.spark.sql_settings import LOCAL_DRIVER, NO_FILE_RELATIONS, NO_KILL_LINKS, NO_VARIABLE_SUBSTITUTION

CONNECT_PORT = 15002  # Spark Connect's default port
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"  # in the pip wheel's jars/
# A pipeline's kept session (connect.py) is ended by the server after this long idle (Spark's default: 1h).
SESSION_IDLE_TIMEOUT = "2h"


def connect_server_command(port: int = CONNECT_PORT, host: str = "127.0.0.1", master: str = "local[*]",
                           log_level: str = "WARN") -> list[str]:
    """spark-submit of SparkConnectServer, listening on host:port. A local master's parallelism is set, so
    that clients read it instead of asking Spark with a query (stage/driver.py: default_parallelism), and
    its driver's RPC and block manager stay on loopback (with connect_server_env's SPARK_LOCAL_IP, its UI
    too) whatever `host` the gRPC port is on. The UI never kills a job."""
    bindir = Path(sys.executable).parent
    cores = _local_cores(master)
    local = cores is not None and _local_ip() == "127.0.0.1"
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
        "--conf", "=".join(NO_KILL_LINKS),
        "--conf", "=".join(NO_FILE_RELATIONS),  # every session's default too, as _prepare sets them (connect.py)
        "--conf", "=".join(NO_VARIABLE_SUBSTITUTION),
        *(["--conf", f"spark.default.parallelism={cores}"] if cores else []),
        *[arg for key, value in (LOCAL_DRIVER if local else ()) for arg in ("--conf", f"{key}={value}")],
    ]


def _local_ip() -> str:
    """The address a local master's driver and UI bind to: SPARK_LOCAL_IP where the environment sets it."""
    return os.environ.get("SPARK_LOCAL_IP") or "127.0.0.1"


def _local_cores(master: str) -> int | None:
    """The cores of a local master (`local`, `local[4]`, `local[*]`), None for a cluster's."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master)
    if match is None:
        return None
    return (os.cpu_count() or 1) if match.group(1) == "*" else int(match.group(1) or 1)


def connect_server_env(master: str = "local[*]") -> dict[str, str]:
    """The server's environment: the venv first on PATH (SPARK_HOME of the wheel), its Python for the workers;
    a local master's SPARK_LOCAL_IP (Spark's UI binds there, else on every interface); none of the secret
    variables (clients send what a batch needs)."""
    venv_first_on_path()
    env = {k: v for k, v in os.environ.items() if k not in SECRET_VARIABLES}
    if _local_cores(master) is not None:
        env["SPARK_LOCAL_IP"] = _local_ip()
    return {**env, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}


class LocalConnectServer:
    """A Spark Connect server from the wheel as a child in its own process group, listening once built
    (`url`); `close()` stops the group: JVM and Python workers. The demo and the Connect benchmark use it."""

    def __init__(self, master: str = "local[*]", port: int | None = None, host: str = "127.0.0.1", output=None,
                 timeout: float = 180):
        self.port = port or free_port(host)
        self.url = f"sc://{host}:{self.port}"
        self.proc = subprocess.Popen(connect_server_command(self.port, host, master), env=connect_server_env(master),
                                     stdout=output, stderr=subprocess.STDOUT if output else None,
                                     start_new_session=True)
        try:
            wait_for_port(host, self.port, self.proc, timeout, "the Spark Connect server")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        stop_group(self.proc, 30)

    def __enter__(self) -> LocalConnectServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_connect(port: int = CONNECT_PORT, host: str = "127.0.0.1", master: str = "local[*]") -> int:
    """Run a local Spark Connect server in the foreground (its output on this terminal), print its sc:// URL
    once it listens, stop it on SIGTERM or Ctrl-C (also while it starts). Returns the server's exit code."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the with block below stops the server
    try:
        with LocalConnectServer(master, port, host) as server:
            print(f"Spark Connect server: {server.url} (master {master}); export LEDGERBATCH_SPARK_REMOTE={server.url}",
                  flush=True)
            return server.proc.wait()
    except KeyboardInterrupt:
        return 0

"""The SparkSession every ledgerbatch job uses, with the package shipped to executors and sources registered.

Two kinds: a classic session (`get_spark(master)`, its own driver JVM, what spark-submit and `ledgerbatch run`
start) and a Spark Connect session (`get_spark(remote="sc://host:15002")`, a client of a long-lived Connect
server, so Spark stays warm between runs). Both stage batches the same way; what ran on the driver's
SparkContext has a Connect form here (`default_parallelism`, the package as a session artifact).
"""
from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
CONNECT_PORT = 15002  # Spark Connect's default port
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"  # in the pip wheel's jars/
REMOTE_ENV = "LEDGERBATCH_SPARK_REMOTE"
CONNECT_MODE_ENV = "SPARK_CONNECT_MODE_ENABLED"  # set by PySpark in a process that made a Connect session


def package_zip(directory: str | Path | None = None) -> str:
    """The package as a zip for executors (`--py-files`, or addPyFile below): its .py files only.

    Executors import it from the zip ahead of anything installed there, so they always run the
    driver's version. Their Python still needs confluent-kafka, pyarrow and psycopg2 installed.
    """
    out = Path(directory or tempfile.mkdtemp(prefix="ledgerbatch-pyfiles-")) / "ledgerbatch.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(PACKAGE_DIR.rglob("*.py")):
            zf.write(path, path.relative_to(PACKAGE_DIR.parent).as_posix())
    return str(out)


@functools.cache
def shipped_zip() -> str:
    """package_zip(), built once per process: what every Spark Connect session gets as an artifact."""
    return package_zip()


def spark_remote() -> str | None:
    """The Spark Connect server of LEDGERBATCH_SPARK_REMOTE (`sc://host:port`), or None."""
    return os.environ.get(REMOTE_ENV) or None


def is_connect(spark) -> bool:
    """Whether `spark` is a Spark Connect session (no SparkContext, no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def get_spark(master: str | None = None, app_name: str = "ledgerbatch", remote: str | None = None):
    """`remote` (`sc://host:port`): a session on that Spark Connect server. Else a classic session, where
    `master` None keeps what spark-submit or the environment chose."""
    if remote:
        return connect_session(remote, app_name)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    _venv_first_on_path()
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
    )
    if master:
        builder = builder.master(master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("LEDGERBATCH_SPARK_LOG_LEVEL", "WARN"))
    if not spark.conf.get("spark.master", "").startswith("local"):
        spark.sparkContext.addPyFile(package_zip())
    _register_sources(spark)
    return spark


def connect_session(remote: str, app_name: str = "ledgerbatch"):
    """A new session on the Spark Connect server `remote`, ready for ledgerbatch: the package's zip added as
    a Python artifact (the server's Python workers import this client's version of it, ahead of anything
    installed there), the range reader and the staging sink registered, UTC session time zone.

    Each call makes its own server-side session (artifacts, temp views and registrations are per session);
    `stop()` it when done. The server's JVM stays up between sessions: that is what keeps Spark warm.
    """
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(remote).config("spark.sql.session.timeZone", "UTC").create()
    spark.addTag(app_name.replace(",", "_"))  # the session's jobs carry it (Spark UI, interruptTag)
    spark.addArtifacts(shipped_zip(), pyfile=True)
    _register_sources(spark)
    return spark


@contextlib.contextmanager
def connect_spark(remote: str, app_name: str = "ledgerbatch"):
    """connect_session() for a with block: stopped at its end, and the process left as it was.

    PySpark marks a process that made a Connect session (the variable SPARK_CONNECT_MODE_ENABLED) and never
    unmarks it: later classic sessions of the process, and its spark-submit children, would then try Spark
    Connect and fail. A long-lived process that mixes both (an Airflow worker, dag.test()) uses this.
    """
    marked = CONNECT_MODE_ENV in os.environ
    spark = connect_session(remote, app_name)
    try:
        yield spark
    finally:
        spark.stop()
        if not marked:
            os.environ.pop(CONNECT_MODE_ENV, None)


def _register_sources(spark) -> None:
    from .source import KafkaRangeSource
    from .stage_tasks import StagingSink

    spark.dataSource.register(KafkaRangeSource)
    spark.dataSource.register(StagingSink)


def default_parallelism(spark) -> int:
    """The cluster's default parallelism (its cores): SparkContext.defaultParallelism on a classic session.
    Spark Connect has no SparkContext: `spark.default.parallelism` where the server sets it, else the number
    of splits Spark gives a `range` without a partition count (which is the default parallelism), found by
    one small JVM-only query; cached per session."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    cached = _PARALLELISM.get(spark.session_id)
    if cached is None:
        configured = spark.conf.get("spark.default.parallelism", None)
        if configured:
            cached = int(configured)
        else:
            from pyspark.sql import functions as F

            ids = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p"))
            cached = ids.agg(F.max("p")).first()[0] + 1
        _PARALLELISM[spark.session_id] = cached
    return cached


_PARALLELISM: dict[str, int] = {}


def warm_up(spark) -> float:
    """Start the executors' Python workers with the staging code imported, so that the first batch of
    a long-lived driver (`run --follow`) is as quick as the ones after it. Returns the seconds taken."""
    import time

    from pyspark.sql.types import LongType, StructField, StructType

    started = time.monotonic()
    tasks = 2 * default_parallelism(spark)
    spark.range(0, tasks, 1, tasks).mapInArrow(_import_staging, StructType([StructField("id", LongType())])).collect()
    return time.monotonic() - started


def _import_staging(batches):
    from . import parse, source, stage_tasks  # noqa: F401  (the imports are the point)

    yield from batches


def _venv_first_on_path() -> None:
    # pip's spark-submit finds SPARK_HOME through the python on PATH: the venv's must come first.
    bindir = str(Path(sys.executable).parent)
    if not os.environ.get("PATH", "").startswith(bindir + os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def connect_server_command(port: int = CONNECT_PORT, host: str = "127.0.0.1", master: str = "local[*]",
                           log_level: str = "WARN") -> list[str]:
    """The pip wheel's own Spark Connect server (what Spark's sbin/start-connect-server.sh runs, which the
    wheel lacks): spark-submit of SparkConnectServer, listening on host:port, in the foreground."""
    bindir = Path(sys.executable).parent
    return [
        str(bindir / "spark-submit"), "--class", CONNECT_SERVER_CLASS, "--name", "ledgerbatch Spark Connect",
        "--master", master,
        "--conf", f"spark.connect.grpc.binding.address={host}",
        "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", "spark.sql.session.timeZone=UTC",
        "--conf", "spark.python.worker.reuse=true",
        "--conf", "spark.ui.showConsoleProgress=false",
        "--conf", f"spark.log.level={log_level}",
    ]


def connect_server_env() -> dict[str, str]:
    """The server's environment: the venv first on PATH (SPARK_HOME of the wheel), its Python for the workers."""
    _venv_first_on_path()
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
    """`ledgerbatch spark-server`: run a local Spark Connect server in the foreground, print its sc:// URL once
    it listens, stop it on SIGTERM or Ctrl-C. Returns the server's exit code."""
    import signal

    process = subprocess.Popen(connect_server_command(port, host, master), env=connect_server_env(),
                               start_new_session=True)

    def stop(*_):
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    try:
        wait_for_port(host, port, process)
        print(f"Spark Connect server: sc://{host}:{port} (master {master}); export {REMOTE_ENV}=sc://{host}:{port}",
              flush=True)
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)

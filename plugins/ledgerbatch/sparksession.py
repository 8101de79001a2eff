"""The SparkSession every ledgerbatch job uses, with the package shipped to executors and sources registered.

Two kinds: a classic session (`get_spark(master)`, its own driver JVM, what spark-submit and `ledgerbatch run`
start) and a Spark Connect session (`get_spark(remote="sc://host:15002")`, a client of a long-lived Connect
server, so Spark stays warm between runs; connect.py). Both stage batches the same way; what ran on the
driver's SparkContext has a Connect form (`default_parallelism` here, the package as a session artifact).
"""
from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def package_zip(directory: str | Path | None = None) -> str:
    """The package as a zip for executors (`--py-files`, addPyFile below, a Connect session's artifact): its
    .py files only.

    Executors import it from the zip ahead of anything installed there, so they always run the
    driver's version. Their Python still needs confluent-kafka, pyarrow and psycopg2 installed.
    """
    out = Path(directory or tempfile.mkdtemp(prefix="ledgerbatch-pyfiles-")) / "ledgerbatch.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(PACKAGE_DIR.rglob("*.py")):
            zf.write(path, path.relative_to(PACKAGE_DIR.parent).as_posix())
    return str(out)


def is_connect(spark) -> bool:
    """Whether `spark` is a Spark Connect session (no SparkContext, no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def get_spark(master: str | None = None, app_name: str = "ledgerbatch", remote: str | None = None):
    """`remote` (`sc://host:port`): a session on that Spark Connect server. Else a classic session, where
    `master` None keeps what spark-submit or the environment chose."""
    if remote:
        from .connect import connect_session

        return connect_session(remote, app_name)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    venv_first_on_path()
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
    register_sources(spark)
    return spark


def register_sources(spark) -> None:
    from .source import KafkaRangeSource
    from .stage_tasks import StagingSink

    spark.dataSource.register(KafkaRangeSource)
    spark.dataSource.register(StagingSink)


def default_parallelism(spark) -> int:
    """The cluster's default parallelism (its cores): SparkContext.defaultParallelism on a classic session.
    Spark Connect has no SparkContext: `spark.default.parallelism` where the server sets it (`ledgerbatch
    spark-server` does for local masters), else the number of splits Spark gives a `range` without a
    partition count (which is the default parallelism), found by one small JVM-only query, cached by this
    process only (a cluster's executors may still have been joining when a kept session was first used)."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    key = spark.session_id
    if key not in _PARALLELISM:
        configured = spark.conf.get("spark.default.parallelism", None)
        if configured:
            _PARALLELISM[key] = int(configured)
        else:
            from pyspark.sql import functions as F

            ids = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p"))
            _PARALLELISM[key] = ids.agg(F.max("p")).first()[0] + 1
    return _PARALLELISM[key]


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


def venv_first_on_path() -> None:
    # pip's spark-submit finds SPARK_HOME through the python on PATH: the venv's must come first.
    bindir = str(Path(sys.executable).parent)
    if not os.environ.get("PATH", "").startswith(bindir + os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")

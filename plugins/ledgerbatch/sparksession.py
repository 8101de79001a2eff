"""The SparkSession every ledgerbatch job uses, with the package shipped to executors and sources registered."""
from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


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


def get_spark(master: str | None = None, app_name: str = "ledgerbatch"):
    """`master` None keeps what spark-submit or the environment chose."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # pip's spark-submit finds SPARK_HOME through the python on PATH: the venv's must come first.
    bindir = str(Path(sys.executable).parent)
    if not os.environ.get("PATH", "").startswith(bindir + os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    from pyspark.sql import SparkSession

    from .source import KafkaRangeSource
    from .stage_tasks import StagingSink

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
    spark.dataSource.register(KafkaRangeSource)
    spark.dataSource.register(StagingSink)
    return spark


def warm_up(spark) -> float:
    """Start the executors' Python workers with the staging code imported, so that the first batch of
    a long-lived driver (`run --follow`) is as quick as the ones after it. Returns the seconds taken."""
    import time

    from pyspark.sql.types import LongType, StructField, StructType

    started = time.monotonic()
    tasks = 2 * spark.sparkContext.defaultParallelism
    spark.range(0, tasks, 1, tasks).mapInArrow(_import_staging, StructType([StructField("id", LongType())])).collect()
    return time.monotonic() - started


def _import_staging(batches):
    from . import parse, source, stage_tasks  # noqa: F401  (the imports are the point)

    yield from batches

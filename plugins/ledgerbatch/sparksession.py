"""The SparkSession every ledgerbatch job uses, with the package shipped to executors and sources registered."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def _package_zip() -> str:
    """Executors on a cluster need the package: ship it as a zip (read-only, no sql/ needed there)."""
    out = Path(tempfile.mkdtemp(prefix="ledgerbatch-pyfiles-")) / "ledgerbatch"
    return shutil.make_archive(str(out), "zip", root_dir=PACKAGE_DIR.parent, base_dir=PACKAGE_DIR.name)


def get_spark(master: str | None = None, app_name: str = "ledgerbatch"):
    """`master` None keeps what spark-submit or the environment chose."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # pip's spark-submit finds SPARK_HOME through the python on PATH: the venv's must come first.
    bindir = str(Path(sys.executable).parent)
    if not os.environ.get("PATH", "").startswith(bindir + os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    from pyspark.sql import SparkSession

    from .source import KafkaRangeSource
    from .stage import StagingSink

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
        spark.sparkContext.addPyFile(_package_zip())
    spark.dataSource.register(KafkaRangeSource)
    spark.dataSource.register(StagingSink)
    return spark

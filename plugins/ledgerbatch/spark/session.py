"""The SparkSession every ledgerbatch job uses, with the package shipped to executors (package.py).

Two kinds: a classic session (`get_spark(master)`, its own driver JVM, what spark-submit and `ledgerbatch run`
start) and a Spark Connect session (`get_spark(remote="sc://host:15002")`, a client of a long-lived Connect
server, so Spark stays warm between runs; connect.py). Both stage batches the same way; what ran on the
driver's SparkContext has a Connect form (stage/driver.py's `default_parallelism`, the package as a session
artifact).
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

from ledgerbatch.config import STAGING_DB_URL
from ledgerbatch.spark.package import package_zip
from ledgerbatch.spark.sql_settings import LOCAL_DRIVER, NO_FILE_RELATIONS, NO_KILL_LINKS, NO_VARIABLE_SUBSTITUTION

# Variables that carry a secret (the database URL with its password, Kafka's and the registry's settings):
# a JVM this process launches, and the Python workers it forks, get none of them.
SECRET_VARIABLES = ("LEDGERBATCH_DB_URL", STAGING_DB_URL, "LEDGERBATCH_KAFKA_OPTIONS", "LEDGERBATCH_SCHEMA_REGISTRY")


def is_connect(spark) -> bool:
    """Whether `spark` is a Spark Connect session (no SparkContext, no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def get_spark(master: str | None = None, app_name: str = "ledgerbatch", remote: str | None = None):
    """`remote` (`sc://host:port`): a session on that Spark Connect server. Else a classic session, where
    `master` None keeps what spark-submit or the environment chose."""
    if remote:
        from ledgerbatch.spark.connect import connect_session

        return connect_session(remote, app_name)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    local = bool(master and master.startswith("local"))
    if local:
        # A local driver needs no other host: its UI and ports stay on loopback (Spark's UI binds to
        # SPARK_LOCAL_IP, else every interface) unless the environment says otherwise.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    venv_first_on_path()
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
        .config(*NO_FILE_RELATIONS)
        .config(*NO_VARIABLE_SUBSTITUTION)
        .config(*NO_KILL_LINKS)
    )
    if master:
        builder = builder.master(master)
    if local and os.environ["SPARK_LOCAL_IP"] == "127.0.0.1":  # not where the environment chose an address
        for key, value in LOCAL_DRIVER:
            builder = builder.config(key, value)
    with _without(SECRET_VARIABLES):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("LEDGERBATCH_SPARK_LOG_LEVEL", "WARN"))
    if not spark.conf.get("spark.master", "").startswith("local"):
        spark.sparkContext.addPyFile(package_zip())
    return spark


def venv_first_on_path() -> None:
    # pip's spark-submit finds SPARK_HOME through the python on PATH: the venv's must come first.
    bindir = str(Path(sys.executable).parent)
    if not os.environ.get("PATH", "").startswith(bindir + os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


@contextmanager
def _without(variables: tuple[str, ...]):
    """os.environ without `variables` for the block (a JVM launched in it inherits the environment)."""
    kept = {v: os.environ.pop(v) for v in variables if v in os.environ}
    try:
        yield
    finally:
        os.environ.update(kept)

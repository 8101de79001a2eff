"""The secret settings of a spark-submit job (the database URL, Kafka's and the registry's client settings)
travel in a file only its owner can read, never on spark-submit's command line or in the Spark properties.

On YARN and Kubernetes the Airflow provider turns a job's environment into `--conf
spark.yarn.appMasterEnv.X=...` / `spark.kubernetes.driverEnv.X=...` arguments: visible in `ps` to every
local user, in the application's properties and in the hook's log. The process task writes this file
instead (mode 0600, in a directory of its own it removes when the job ends) and names it in the job's
arguments; where the driver runs on a YARN cluster, spark-submit ships it with `--files` into the driver's
container. A Kubernetes cluster driver reads a Kubernetes secret instead (SECRET_KEYS; docs/cluster.md).
The stager's URL (LEDGERBATCH_STAGING_DB_URL, config.staging_db_url), where the task has one, goes the same
ways: a cluster driver does not inherit the Airflow worker's environment and would stage with the ledger's login.
"""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from ledgerbatch.config import STAGING_DB_URL, Settings
from ledgerbatch.errors import ConfigError

FILE_NAME = "ledgerbatch-settings.json"
# The environment variable each secret setting is read from, and its key in a Kubernetes secret.
SECRET_KEYS = {"LEDGERBATCH_DB_URL": "db-url", "LEDGERBATCH_KAFKA_OPTIONS": "kafka-options",
               "LEDGERBATCH_SCHEMA_REGISTRY": "schema-registry"}
STAGING_KEY = "staging-db-url"  # the stager's URL in a Kubernetes secret, when the task has one


def write_settings_file(directory: Path, settings: Settings, staging_db_url: str | None = None) -> Path:
    """The secret settings as JSON in `directory`, readable by this user only from its first byte; the
    stager's URL too when there is one."""
    path = Path(directory) / FILE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"db_url": settings.db_url, "kafka_options": settings.kafka_options,
                   "schema_registry": settings.schema_registry,
                   **({"staging_db_url": staging_db_url} if staging_db_url else {})}, out)
    return path



def with_settings_file(settings: Settings, path: str) -> Settings:
    """`settings` with the secret ones from the file at `path` (the driver runs beside spark-submit), else
    from the file of that name in the working directory (a YARN cluster driver's container, where
    `--files` put it). A stager's URL in the file goes into this process's environment, where staging reads it
    (config.staging_db_url) and whence no JVM or worker of a session inherits it (spark/session.py)."""
    found = Path(path) if Path(path).is_file() else Path.cwd() / Path(path).name
    try:
        values = json.loads(found.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"the job's settings file {path} cannot be read: {exc}") from None
    if values.get("staging_db_url"):
        os.environ[STAGING_DB_URL] = values["staging_db_url"]
    return replace(settings, db_url=values["db_url"], kafka_options=values["kafka_options"],
                   schema_registry=values["schema_registry"])


def kubernetes_secret_refs(secret: str, staging: bool = False) -> dict[str, str]:
    """Spark properties that set the driver's secret variables from the Kubernetes secret `secret` (keys
    SECRET_KEYS, and STAGING_KEY with `staging`), which the operator created: the values never pass through
    spark-submit."""
    keys = {**SECRET_KEYS, **({STAGING_DB_URL: STAGING_KEY} if staging else {})}
    return {f"spark.kubernetes.driver.secretKeyRef.{variable}": f"{secret}:{key}" for variable, key in keys.items()}

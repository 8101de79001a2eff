"""Settings from the environment (the CLI and Spark jobs); Airflow passes the same values from Connections."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import make_url

from ledgerbatch.errors import ConfigError

DEFAULT_DB_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
PACKAGE_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_ROOT.parents[1]  # the repo, when the package runs from its plugins/ folder


def shipped(name: str) -> Path:
    """`sql` or `spark_jobs`: in an installed wheel at ledgerbatch/_<name> (pyproject.toml maps them there),
    in the repo at its top level."""
    packaged = PACKAGE_ROOT / f"_{name}"
    return packaged if packaged.is_dir() else REPO_ROOT / name


@dataclass(frozen=True)
class Settings:
    db_url: str
    bootstrap_servers: str | None
    pipelines_dir: Path
    spark_master: str
    kafka_options: dict = field(default_factory=dict)  # consumer settings for every pipeline (security, ...)
    schema_registry: dict = field(default_factory=dict)  # registry client settings for the registry formats
    spark_remote: str | None = None  # a Spark Connect server (sc://host:port): batches run there, not in a new JVM

    @classmethod
    def from_env(cls) -> "Settings":
        return cls(
            db_url=os.environ.get("LEDGERBATCH_DB_URL") or DEFAULT_DB_URL,
            bootstrap_servers=os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or None,
            pipelines_dir=Path(os.environ.get("LEDGERBATCH_PIPELINES_DIR") or "pipelines"),
            spark_master=os.environ.get("LEDGERBATCH_SPARK_MASTER") or "local[*]",
            kafka_options=_json_object("LEDGERBATCH_KAFKA_OPTIONS", "librdkafka settings"),
            schema_registry=_json_object("LEDGERBATCH_SCHEMA_REGISTRY", "schema registry client settings (url, ...)"),
            spark_remote=os.environ.get("LEDGERBATCH_SPARK_REMOTE") or None,
        )

    def require_bootstrap(self) -> str:
        if not self.bootstrap_servers:
            raise ConfigError("KAFKA_BOOTSTRAP_SERVERS is not set (start one with `ledgerbatch dev-broker`)")
        return self.bootstrap_servers


def _json_object(variable: str, what: str) -> dict:
    try:
        value = json.loads(os.environ.get(variable) or "{}")
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise ConfigError(f"{variable} must be a JSON object of {what}")
    return value


def safe_url(url: str) -> str:
    """The URL with its password masked, for logs and errors."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"


def libpq_dsn(url: str) -> str:
    """A libpq connection string for executors, which connect with psycopg2 directly. Every query parameter
    passes through (sslmode, sslrootcert, connect_timeout, application_name, target_session_attrs, ...);
    a multi-host URL (`?host=a:5432&host=b:5432`) becomes libpq's host and port lists."""
    u = make_url(url)
    parts = {"host": u.host, "port": u.port, "dbname": u.database, "user": u.username, "password": u.password}
    for key, value in u.query.items():
        if key == "host":
            parts.update(_hosts(value if isinstance(value, tuple) else (value,)))
        elif isinstance(value, str):
            parts[key] = value
    return " ".join(f"{k}={_dsn_quote(str(v))}" for k, v in parts.items() if v is not None)


def _hosts(hosts: tuple[str, ...]) -> dict[str, str | None]:
    """`host=a:5432&host=b` as libpq's `host=a,b port=5432,` (an empty port is the default); a socket
    directory (`/run/postgresql`) is a host as it is."""
    names, ports = [], []
    for h in hosts:
        name, colon, port = h.rpartition(":") if not h.startswith("/") else ("", "", "")
        names.append(name if colon else h)
        ports.append(port if colon else "")
    return {"host": ",".join(names), "port": ",".join(ports) if any(ports) else None}


def _dsn_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

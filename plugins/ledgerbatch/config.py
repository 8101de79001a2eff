"""Settings from the environment (the CLI and Spark jobs); Airflow passes the same values from Connections."""
from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import make_url

from ledgerbatch.errors import ConfigError

DEFAULT_DB_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
STAGING_DB_URL = "LEDGERBATCH_STAGING_DB_URL"
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


def staging_db_url(db_url: str) -> str:
    """The URL executors stage with (the Spark Connect server and every executor get it): a login of
    ledgerbatch_stager, which may only COPY into staging tables. Without one they get the ledger's own URL,
    with a warning: that login can change the ledger from every machine it reaches."""
    url = os.environ.get(STAGING_DB_URL)
    if url:
        return url
    _warn_no_staging_url(safe_url(db_url))
    return db_url


@functools.cache
def _warn_no_staging_url(ledger_url: str) -> None:  # once a process, not once a batch
    logging.getLogger(__name__).warning(
        "%s is not set: executors stage with the ledger's login %s; give them a ledgerbatch_stager login "
        "(docs/operations.md, Database roles)", STAGING_DB_URL, ledger_url)


def libpq_dsn(url: str) -> str:
    """A libpq connection string for executors, which connect with psycopg2 directly: exactly the
    arguments SQLAlchemy's psycopg2 dialect hands psycopg2.connect for `url` (its create_connect_args), so
    every executor reaches the server(s) the driver reaches, whatever the URL's form: a host and port in
    the authority or in the query, in either order (`?port=P&host=h`), `?host=a:p&host=b:q`, libpq's lists
    (`?host=a,b&port=p,q`), a socket directory (`?host=/run/postgresql`), `?service=name`. Every other
    query parameter passes through (sslmode, sslrootcert, connect_timeout, application_name,
    target_session_attrs, ...). The host and port come first, then the database, user and password."""
    from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2

    u = make_url(url)
    if u.get_backend_name() != "postgresql":
        raise ConfigError(f"{safe_url(url)} is not a PostgreSQL URL")
    _, params = PGDialect_psycopg2().create_connect_args(u.set(drivername="postgresql+psycopg2"))
    first = ("host", "port", "dbname", "user", "password")
    ordered = [(k, params[k]) for k in first if k in params] + [(k, v) for k, v in params.items() if k not in first]
    return " ".join(f"{k}={_dsn_quote(str(v))}" for k, v in ordered if v is not None)


def _dsn_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

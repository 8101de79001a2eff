"""Spark Connect sessions for ledgerbatch: the package as a session artifact, the range reader and the staging
sink registered, UTC session time zone; and sessions kept warm on the server between a pipeline's runs.

A new server-side session gets new Python workers on the server (their environment holds the session's own
artifact directory), and starting them costs seconds; a kept session finds them warm. A pipeline's live
batches therefore run in one kept session, named by the pipeline and the package's content, that outlives
each client: the next run's client attaches to it. Live batches of one pipeline never run side by side (the
ledger plans the next only after the last is committed; a zombie attempt of the same batch is fenced at its
mark), so they may share its temp view `batch`. Replays and backfills, which may run beside them, get a
session of their own that ends with them.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import uuid

from .sparksession import PACKAGE_DIR, package_zip, register_sources

log = logging.getLogger(__name__)
CONNECT_MODE_ENV = "SPARK_CONNECT_MODE_ENABLED"  # set by PySpark in a process that made a Connect session
_PREPARED = "ledgerbatch.prepared"  # session conf: the package digest whose artifact and sources it holds
# A kept session the server closed (idle timeout, a release) cannot be attached again under its id: the next
# generation's id is tried, up to this many.
_GENERATIONS = 32


@functools.cache
def shipped_zip() -> str:
    """package_zip(), built once per process: what every session gets as an artifact."""
    return package_zip()


@functools.cache
def package_digest() -> str:
    """The package's content (every .py file, by path): a kept session serves one version of it only."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        h.update(path.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def kept_session_id(name: str, generation: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"ledgerbatch:{name}:{package_digest()}:{generation}"))


def connect_session(remote: str, app_name: str = "ledgerbatch", keep: str | None = None):
    """A session on the Spark Connect server `remote` (`sc://host:port[/;params]`), ready for ledgerbatch.

    `keep` None: a new server-side session; `stop()` ends it. `keep` a name (`live:<pipeline>`): the kept
    session of that name, created on first use, attached to afterwards; stop it with `stop_client` so it
    stays on the server. A `session_id` in `remote` names the session itself: that one is used.
    """
    if keep is None:
        return _prepare(_create(remote), app_name)
    if "session_id=" in remote:  # the user named the session: that one, kept
        return _prepare(_create(remote), app_name)
    for generation in range(_GENERATIONS):
        spark = _create(_with_session_id(remote, kept_session_id(keep, generation)))
        try:
            return _prepare(spark, app_name)
        except Exception as exc:
            if "INVALID_HANDLE.SESSION_CLOSED" not in str(exc):
                stop_client(spark)
                raise
            stop_client(spark)
    raise RuntimeError(f"Spark Connect server {remote.split(';')[0]}: the last {_GENERATIONS} kept sessions of "
                       f"{keep!r} are closed; restart the server or run with a new package version")


def _with_session_id(remote: str, session_id: str) -> str:
    base, sep, params = remote.partition("/;")
    return f"{base.rstrip('/')}/;{params + ';' if sep else ''}session_id={session_id}"


def _create(remote: str):
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(remote).create()


def _prepare(spark, app_name: str):
    """Ship the package and register the sources, once per session: a kept session remembers that it holds
    them (session conf `ledgerbatch.prepared`), so attaching costs one round trip."""
    if spark.conf.get(_PREPARED, None) != package_digest():
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        try:
            spark.addArtifacts(shipped_zip(), pyfile=True)
        except Exception as exc:  # an attempt that died before marking the session added it: same digest, same zip
            if "ARTIFACT_ALREADY_EXISTS" not in str(exc):
                raise
        register_sources(spark)
        spark.conf.set(_PREPARED, package_digest())
    spark.addTag(app_name.replace(",", "_"))  # this client's jobs carry it (Spark UI, interruptTag)
    return spark


def stop_client(spark) -> None:
    """Close this client and leave its server-side session (a kept one) on the server."""
    spark.release_session_on_close = False
    spark.stop()


@contextlib.contextmanager
def connect_spark(remote: str, app_name: str = "ledgerbatch", keep: str | None = None):
    """connect_session() for a with block: at its end the client is stopped (a kept session stays on the
    server, any other ends), and the process left as it was.

    PySpark marks a process that made a Connect session (the variable SPARK_CONNECT_MODE_ENABLED) and never
    unmarks it: later classic sessions of the process, and its spark-submit children, would then try Spark
    Connect and fail. A long-lived process that mixes both (an Airflow worker, dag.test()) uses this.
    """
    marked = CONNECT_MODE_ENV in os.environ
    spark = connect_session(remote, app_name, keep)
    try:
        yield spark
    finally:
        stop_client(spark) if keep else spark.stop()
        if not marked:
            os.environ.pop(CONNECT_MODE_ENV, None)

"""Spark Connect sessions for ledgerbatch: the package as a session artifact, UTC session time zone; and a
pipeline's live batches in one session kept on the server.

A new server-side session gets a new Python daemon and workers on the server (their environment holds the
session's own artifact directory), and starting them costs seconds; so does shipping the package. A pipeline's live batches therefore run in one kept session, named by the
pipeline, the package's content and the day (UTC), that outlives each client: the next run's client
attaches to it. Spark stops a Python worker after 60 s idle (the daemon stays), so a run within a minute
of the last finds its workers warm, a later one forks new ones from the warm daemon. Live batches of one
pipeline never run side by side (max one active DAG run; the ledger plans the next batch only after the
last is committed; a zombie attempt is fenced at its mark), and nothing per batch lives in the session
(transform.run_query binds `batch` per statement). Replays and backfills, which may run beside them, get
a session of their own that ends with them.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import logging
import os
import uuid

from ledgerbatch.errors import ConfigError
from ledgerbatch.spark.package import PACKAGE_DIR, package_zip
from ledgerbatch.spark.sql_settings import NO_FILE_RELATIONS, NO_VARIABLE_SUBSTITUTION

log = logging.getLogger(__name__)
CONNECT_MODE_ENV = "SPARK_CONNECT_MODE_ENABLED"  # set by PySpark in a process that made a Connect session
_PREPARED = "ledgerbatch.prepared"  # session conf: the package digest whose artifact and sources it holds
# The server refuses a closed session's id for good (an idle timeout closes it too): the next generation's id
# is tried. Ids start afresh each day, and a day has at most 12 idle timeouts of `ledgerbatch spark-server`
# (2 h), 24 of Spark's default (1 h); past these, a session of its own for the task.
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


def kept_session_id(name: str, generation: int, day: dt.date | None = None) -> str:
    day = day or dt.datetime.now(dt.timezone.utc).date()
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"ledgerbatch:{name}:{package_digest()}:{day}:{generation}"))


def connect_session(remote: str, app_name: str = "ledgerbatch", keep: str | None = None):
    """A session on the Spark Connect server `remote` (`sc://host:port[/;params]`), ready for ledgerbatch.

    `keep` None: a new server-side session; `stop()` ends it. `keep` a name (`live:<pipeline>`): the kept
    session of that name, created on first use, attached to afterwards; `stop_client` leaves it on the server.
    """
    if "session_id=" in remote:
        raise ConfigError("the Spark Connect URL names a session (session_id=...): leave it out, ledgerbatch "
                          "names its sessions itself")
    if keep is None:
        return _prepare(_create(remote), app_name)
    day = dt.datetime.now(dt.timezone.utc).date()
    for generation in range(_GENERATIONS):
        spark = _create(_with_session_id(remote, kept_session_id(keep, generation, day)))
        try:
            return _prepare(spark, app_name)
        except Exception as exc:
            stop_client(spark)
            if "INVALID_HANDLE.SESSION_CLOSED" not in str(exc):
                raise
    log.warning("Spark Connect: the last %d kept sessions of %s are closed; this run uses a session of its own",
                _GENERATIONS, keep)
    return _prepare(_create(remote), app_name)


def _with_session_id(remote: str, session_id: str) -> str:
    base, sep, params = remote.partition("/;")
    return f"{base.rstrip('/')}/;{params + ';' if sep else ''}session_id={session_id}"


def _create(remote: str):
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(remote).create()


def _prepare(spark, app_name: str):
    """Ship the package, set the time zone and turn file relations and variable substitution off, once per
    session: a kept session remembers that it holds them (session conf `ledgerbatch.prepared`), so attaching
    costs one round trip."""
    if spark.conf.get(_PREPARED, None) != package_digest():
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        spark.conf.set(*NO_FILE_RELATIONS)
        spark.conf.set(*NO_VARIABLE_SUBSTITUTION)
        try:
            spark.addArtifacts(shipped_zip(), pyfile=True)
        except Exception as exc:  # an attempt that died before marking the session added it: same digest, same zip
            if "ARTIFACT_ALREADY_EXISTS" not in str(exc):
                raise
        spark.conf.set(_PREPARED, package_digest())
    spark.addTag(_tag(app_name))  # this client's jobs carry it (Spark UI, interruptTag)
    return spark


def _tag(app_name: str) -> str:
    return app_name.replace(",", "_")


def stop_client(spark) -> None:
    """Close this client and leave its server-side session (a kept one) on the server."""
    spark.release_session_on_close = False
    spark.stop()


@contextlib.contextmanager
def connect_spark(remote: str, app_name: str = "ledgerbatch", keep: str | None = None):
    """connect_session() for a with block: at its end the client is stopped (a kept session stays on the
    server, any other ends, and with it its jobs); a block that fails interrupts its jobs on the server first,
    so a kept session does not go on reading for a task that was killed or gave up.

    PySpark marks a process that made a Connect session (the variable SPARK_CONNECT_MODE_ENABLED) and never
    unmarks it: later classic sessions of the process, and its spark-submit children, would then try Spark
    Connect and fail. A long-lived process that mixes both (an Airflow worker, dag.test()) uses this.
    """
    marked = CONNECT_MODE_ENV in os.environ
    spark = None
    try:
        spark = connect_session(remote, app_name, keep)
        yield spark
    except BaseException:
        if spark is not None and keep:
            with contextlib.suppress(Exception):  # the server itself may be why the block failed
                spark.interruptTag(_tag(app_name))
        raise
    finally:
        if spark is not None:
            stop_client(spark) if keep else spark.stop()
        if not marked:
            os.environ.pop(CONNECT_MODE_ENV, None)

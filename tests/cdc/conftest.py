"""Fixtures for tests that need real Debezium change events.

- `cdc_source` (session): the CDC source cluster on 127.0.0.1:5433 with wal_level = logical (created and
  started on first use, see source_db.py) and a fresh database on it.
- `capture` (function): starts Debezium's embedded engine in a child process over tables of that database,
  producing into the session's dev broker (`broker`, tests/conftest.py); everything it started is stopped at
  the end of the test, and a slot a killed capture left behind is dropped.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import time
from dataclasses import dataclass, field

import pytest

from ..conftest import per_worker
from . import source_db
from .capture import Capture, debezium_properties

CDC_DB = per_worker(os.environ.get("LEDGERBATCH_CDC_TEST_DB", "ledgerbatch_cdc_test"))  # separate sessions need separate names
_names = itertools.count()


@dataclass
class CdcSource:
    dbname: str
    setup: str  # what ensure_cluster did: created/started/reused
    setup_seconds: float
    host: str = source_db.HOST
    port: int = source_db.PORT
    user: str = source_db.USER
    _tables: itertools.count = field(default_factory=itertools.count)

    def connect(self):
        """A psycopg2 connection to the source database (not autocommit: `with conn:` is one transaction)."""
        return source_db.connect(self.dbname)

    def new_table(self, prefix: str = "accounts") -> str:
        return f"{prefix}_{os.getpid()}_{next(self._tables)}"

    def execute(self, sql: str, params=None) -> None:
        with contextlib.closing(self.connect()) as conn, conn, conn.cursor() as cur:
            cur.execute(sql, params)


@pytest.fixture(scope="session")
def cdc_source() -> CdcSource:
    started = time.monotonic()
    setup = source_db.ensure_cluster()
    dbname = source_db.fresh_database(CDC_DB)
    return CdcSource(dbname=dbname, setup=setup, setup_seconds=time.monotonic() - started)


class Captures:
    """Starts captures (`start`) and stops every one of them at the end of the test."""

    def __init__(self, source: CdcSource, broker, workdir):
        self.source, self.broker, self.workdir = source, broker, workdir
        self.started: list[Capture] = []

    def start(self, tables: list[str], *, schemas_enable: bool = True, decimal_mode: str = "precise",
              partitions: int = 4, **extra: str) -> Capture:
        """Capture `tables` (names in schema public) into topics `<prefix>.public.<table>`, `partitions` each.

        The topics are created first, so their partition count is known; `capture.topics[table]` names them.
        """
        n = next(_names)
        prefix, slot = f"cdc{os.getpid()}_{n}", f"lb_cdc_{os.getpid()}_{n}"
        topics = {t: f"{prefix}.public.{t}" for t in tables}
        for topic in topics.values():
            self.broker.create_topic(topic, partitions)
        props = debezium_properties(dbname=self.source.dbname, tables=[f"public.{t}" for t in tables], slot=slot,
                                    topic_prefix=prefix, schemas_enable=schemas_enable, decimal_mode=decimal_mode,
                                    host=self.source.host, port=self.source.port, user=self.source.user, **extra)
        capture = Capture(props, self.broker.bootstrap_servers, self.workdir / f"capture-{n}")
        capture.topics = topics
        capture.slot = slot
        self.started.append(capture)
        return capture.start()

    def stop_all(self) -> None:
        for capture in self.started:
            capture.stop()
        if self.started:
            source_db.drop_slots(self.source.dbname, f"lb_cdc_{os.getpid()}_")


@pytest.fixture
def capture(cdc_source, broker, tmp_path):
    captures = Captures(cdc_source, broker, tmp_path)
    yield captures
    captures.stop_all()

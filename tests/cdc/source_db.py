"""The CDC source: a second PostgreSQL cluster of this machine, `cdc` on port 5433, with `wal_level = logical`.

The machine's main cluster (5432) is never touched. On a Debian machine (pg_createcluster, as root) the
cluster is created on first use, configured through a file of its own in conf.d plus its pg_hba.conf, and
started with pg_ctlcluster. A cluster already running on the port with `wal_level = logical` is reused as it
is, by anyone. It is left running after the tests: the next session reuses it in well under a second.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from pathlib import Path

import psycopg2

HOST = "127.0.0.1"
PORT = int(os.environ.get("LEDGERBATCH_CDC_PORT", "5433"))
USER = "postgres"
CLUSTER = "cdc"
CONF_NAME = "ledgerbatch-cdc.conf"
CONF = """\
# Written by tests/cdc/source_db.py: the CDC source cluster of ledgerbatch's tests.
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
listen_addresses = '127.0.0.1'
# Slots a killed capture left behind must not fill the disk.
max_slot_wal_keep_size = '1GB'
fsync = off
synchronous_commit = off
full_page_writes = off
"""
HBA = """\
# Written by tests/cdc/source_db.py: a throw-away test cluster on the loopback only, trust everywhere.
local   all             all                                     trust
host    all             all             127.0.0.1/32            trust
host    all             all             ::1/128                 trust
local   replication     all                                     trust
host    replication     all             127.0.0.1/32            trust
host    replication     all             ::1/128                 trust
"""
LOCK = Path("/tmp/ledgerbatch-cdc-cluster.lock")


class SourceUnavailable(RuntimeError):
    pass


def connect(dbname: str = "postgres", **kw):
    return psycopg2.connect(host=HOST, port=PORT, user=USER, dbname=dbname, connect_timeout=3, **kw)


def _wal_level() -> str | None:
    """The running server's wal_level, or None when nothing answers on the port."""
    try:
        with contextlib.closing(connect()) as conn, conn.cursor() as cur:
            cur.execute("SHOW wal_level")
            return cur.fetchone()[0]
    except psycopg2.OperationalError:
        return None


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SourceUnavailable(f"{' '.join(cmd)} exited {done.returncode}: {(done.stdout + done.stderr).strip()}")


def _version() -> str:
    versions = sorted(os.listdir("/etc/postgresql"), key=lambda v: [int(p) for p in v.split(".") if p.isdigit()])
    if not versions:
        raise SourceUnavailable("no PostgreSQL version under /etc/postgresql")
    return versions[-1]


def _write(path: Path, text: str) -> bool:
    """Write text if it differs; keep the file owned like its directory (postgres). True if it changed."""
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    st = path.parent.stat()
    os.chown(path, st.st_uid, st.st_gid)
    return True


def ensure_cluster() -> str:
    """Make sure the CDC source cluster answers on PORT with wal_level = logical; say what was done."""
    if _wal_level() == "logical":
        return f"reused the server on {HOST}:{PORT}"
    if os.geteuid() != 0 or not shutil.which("pg_createcluster") or not os.path.isdir("/etc/postgresql"):
        level = _wal_level()
        raise SourceUnavailable(
            f"the CDC tests need a PostgreSQL server on {HOST}:{PORT} with wal_level = logical "
            + (f"(it has wal_level = {level})" if level else "(nothing answers there)")
            + "; as root on Debian they create one themselves (pg_createcluster <version> cdc -p 5433)")
    LOCK.touch(exist_ok=True)
    with open(LOCK) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test session may be creating it right now
        if _wal_level() == "logical":
            return f"reused the server on {HOST}:{PORT} (another session started it)"
        version = _version()
        etc = Path("/etc/postgresql") / version / CLUSTER
        did = []
        if etc.is_dir() and not (etc / "postgresql.conf").exists():
            # What pg_dropcluster leaves of a cluster of ours: only the files written below.
            ours = {etc / "pg_hba.conf", etc / "conf.d", etc / "conf.d" / CONF_NAME}
            if set(etc.rglob("*")) - ours:
                raise SourceUnavailable(f"{etc} exists without postgresql.conf and holds files that are not "
                                        f"ours: remove it, or create the cluster on port {PORT} by hand")
            shutil.rmtree(etc)
            did.append(f"removed the remains of a dropped cluster in {etc}")
        if not etc.is_dir():
            _run("pg_createcluster", version, CLUSTER, "-p", str(PORT), "--start-conf", "manual")
            did.append(f"created cluster {version}/{CLUSTER}")
        conf_d = etc / "conf.d"
        conf_d.mkdir(exist_ok=True)
        changed = _write(conf_d / CONF_NAME, CONF)
        changed |= _write(etc / "pg_hba.conf", HBA)
        # Its port is fixed in its own postgresql.conf by pg_createcluster; a cluster made by hand on
        # another port is not ours to move.
        running = subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, CLUSTER, "status"],
                                 capture_output=True).returncode == 0
        if running:
            # Running but not logical (or not answering): restart only this cluster, never main.
            _run("pg_ctlcluster", "--skip-systemctl-redirect", version, CLUSTER, "restart")
            did.append("restarted it" + (" with the new settings" if changed else ""))
        else:
            _run("pg_ctlcluster", "--skip-systemctl-redirect", version, CLUSTER, "start")
            did.append("started it")
        deadline = time.monotonic() + 60
        while (level := _wal_level()) != "logical":
            if time.monotonic() > deadline:
                raise SourceUnavailable(f"cluster {version}/{CLUSTER} does not answer on {HOST}:{PORT} with "
                                        f"wal_level = logical (wal_level: {level}); see "
                                        f"/var/log/postgresql/postgresql-{version}-{CLUSTER}.log")
            time.sleep(0.2)
        return f"{', '.join(did)}: {version}/{CLUSTER} on {HOST}:{PORT}"


def fresh_database(name: str) -> str:
    """Drop and create database `name` on the source cluster (its replication slots first); return its name."""
    with contextlib.closing(connect()) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s", (name,))
            for slot, pid in cur.fetchall():
                if pid:
                    cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    time.sleep(0.2)
                cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cur.execute(f'CREATE DATABASE "{name}"')
    return name


def drop_slots(dbname: str, prefix: str) -> None:
    """Drop the inactive slots whose name starts with prefix (what a killed capture leaves behind)."""
    with contextlib.closing(connect(dbname)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE NOT active AND database = %s AND slot_name LIKE %s", (dbname, prefix + "%"))

"""A PostgreSQL cluster of the test's own (DESIGN.md, fourth round): initdb and pg_ctl from the machine's
PostgreSQL 15, run as the `postgres` user, on a free loopback port, trust on loopback; a streaming standby by
pg_basebackup -R, failed over by pg_ctl promote. The machine's own server is never touched. And a TCP proxy
in front of it, standing in for the VIP or HAProxy a deployment reaches its database through."""
from __future__ import annotations

import os
import selectors
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psycopg2

BIN = Path("/usr/lib/postgresql/15/bin")
CONF = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{root}'
fsync = off
full_page_writes = off
wal_level = replica
max_wal_senders = 5
hot_standby = on
max_connections = 60
"""
HBA = """
local all all trust
host all all 127.0.0.1/32 trust
local replication all trust
host replication all 127.0.0.1/32 trust
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(*cmd) -> subprocess.CompletedProcess:
    """Run a PostgreSQL program as the `postgres` user (PostgreSQL refuses root)."""
    run = ["runuser", "-u", "postgres", "--", *map(str, cmd)] if os.geteuid() == 0 else list(map(str, cmd))
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise RuntimeError(f"{' '.join(run)} exited {done.returncode}: {(done.stdout + done.stderr).strip()[-2000:]}")
    return done


class Cluster:
    def __init__(self, root: Path, port: int):
        self.root, self.port, self.data = root, port, root / "data"

    @classmethod
    def create(cls) -> "Cluster":
        root = Path(tempfile.mkdtemp(prefix="ledgerbatch-pg-", dir="/tmp"))
        shutil.chown(root, "postgres", "postgres")
        cluster = cls(root, free_port())
        _as_postgres(BIN / "initdb", "-D", cluster.data, "-U", "postgres", "-A", "trust", "--no-sync")
        cluster._configure()
        cluster.start()
        return cluster

    def standby(self) -> "Cluster":
        """A streaming standby of this cluster (asynchronous), started."""
        root = Path(tempfile.mkdtemp(prefix="ledgerbatch-pg-standby-", dir="/tmp"))
        shutil.chown(root, "postgres", "postgres")
        standby = Cluster(root, free_port())
        _as_postgres(BIN / "pg_basebackup", "-h", "127.0.0.1", "-p", self.port, "-U", "postgres", "-D", standby.data,
                     "-R", "-X", "stream", "--no-sync", "--checkpoint=fast")
        standby._configure()
        standby.start()
        return standby

    def _configure(self) -> None:
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(CONF.format(port=self.port, root=self.root))
        (self.data / "pg_hba.conf").write_text(HBA)

    def start(self) -> None:
        _as_postgres(BIN / "pg_ctl", "-D", self.data, "-l", self.root / "log", "-w", "-t", "60", "start")

    def stop(self, mode: str = "immediate") -> None:
        _as_postgres(BIN / "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def restart(self, mode: str = "immediate") -> None:
        self.stop(mode)
        self.start()

    def promote(self) -> None:
        _as_postgres(BIN / "pg_ctl", "-D", self.data, "-w", "promote")

    def url(self, dbname: str = "postgres", port: int | None = None) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{port or self.port}/{dbname}"

    def execute(self, sql: str, dbname: str = "postgres"):
        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, connect_timeout=5)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall() if cur.description else None
        finally:
            conn.close()

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except RuntimeError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


class Proxy:
    """Forwards 127.0.0.1:port to a cluster's port; `point_at` moves it (a VIP after a failover), dropping
    the connections it carried; `cut_after(marker, prelude)` closes the next connection that sends `marker`
    after it sent `prelude`, right after forwarding the marker, before the server's reply (a COMMIT whose
    outcome is lost)."""

    def __init__(self, target_port: int):
        self.port, self.target = free_port(), target_port
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._cut: tuple[bytes, bytes] | None = None
        self.cuts = 0
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def point_at(self, port: int) -> None:
        with self._lock:
            self.target = port
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            _close(a, b)

    def cut_after(self, marker: bytes, prelude: bytes) -> None:
        self._cut = marker, prelude

    def close(self) -> None:
        self._stopped = True
        self._listener.close()
        self.point_at(self.target)

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()  # nothing listens there now: the client sees the outage
                continue
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, server)
        sel.register(server, selectors.EVENT_READ, client)
        prelude_seen = False
        try:
            while True:
                for key, _ in sel.select(timeout=1):
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    key.data.sendall(data)
                    cut = self._cut
                    if key.fileobj is not client or cut is None:
                        continue
                    prelude_seen = prelude_seen or cut[1] in data
                    if prelude_seen and cut[0] in data:
                        self._cut = None
                        self.cuts += 1
                        time.sleep(0.2)  # the server has the COMMIT; its reply never reaches the client
                        return
        except OSError:
            return
        finally:
            sel.close()
            _close(client, server)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()

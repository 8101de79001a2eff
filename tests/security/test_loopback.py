"""Loopback by default (issue #51): what the servers ledgerbatch starts really listen on, read from the
kernel's socket tables; the demo's Airflow and the compose stack's published ports."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.integration.helpers import REPO

pytestmark = pytest.mark.integration


def _group(pid: int) -> set[int]:
    """`pid` and every process of its process group."""
    pgid = os.getpgid(pid)
    found = {pid}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.getpgid(int(proc.name)) == pgid:
                found.add(int(proc.name))
        except (OSError, ProcessLookupError):
            continue
    return found


def _descendants(pid: int) -> set[int]:
    found, added = {pid}, True
    while added:
        added = False
        for proc in Path("/proc").iterdir():
            try:
                parent = int((proc / "stat").read_text().rsplit(") ", 1)[1].split()[1]) if proc.name.isdigit() else 0
            except (OSError, IndexError, ValueError):
                continue
            if parent in found and int(proc.name) not in found:
                found.add(int(proc.name))
                added = True
    return found


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # it ended meanwhile
        return b""


def listening(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket the processes hold: 'loopback', 'any' or the address."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].rsplit(":", 1)
            found.add((_scope(address), int(port, 16)))
    return found


def _scope(hex_address: str) -> str:
    if set(hex_address) == {"0"}:
        return "any"
    if hex_address == "00000000000000000000000001000000":  # ::1
        return "loopback"
    v4 = hex_address[-8:] if len(hex_address) == 8 or hex_address.startswith("0000000000000000FFFF0000") else None
    if v4 is None:
        return hex_address
    ip = ".".join(str(int(v4[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return "loopback" if ip.startswith("127.") else ip


def test_a_local_session_listens_on_loopback_only_and_its_ui_cannot_kill(spark):
    jvm = spark.sparkContext._gateway.proc.pid  # the JVM pyspark launched for this session
    sockets = listening(_descendants(jvm))
    ui_port = int(spark.sparkContext.uiWebUrl.rsplit(":", 1)[1])
    assert ("loopback", ui_port) in sockets  # the UI is up, on loopback
    assert {scope for scope, _ in sockets} == {"loopback"}, sockets
    conf = dict(spark.sparkContext.getConf().getAll())
    assert conf["spark.ui.killEnabled"] == "false" and conf["spark.sql.runSQLOnFiles"] == "false"
    assert conf["spark.sql.variable.substitute"] == "false"
    assert conf["spark.driver.bindAddress"] == conf["spark.driver.host"] == "127.0.0.1"


def test_spark_server_keeps_its_ui_and_driver_ports_on_loopback(monkeypatch):
    from ledgerbatch.spark.server import LocalConnectServer

    monkeypatch.setenv("LEDGERBATCH_DB_URL", "postgresql+psycopg2://etl:DbPw-in-env@db/ledger")
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    with LocalConnectServer("local[1]") as server:
        group = _group(server.proc.pid)
        sockets = listening(group)
        environments = [_environ(pid) for pid in group]
    assert ("loopback", server.port) in sockets and len(sockets) >= 3  # gRPC, UI, driver RPC, block manager
    assert {scope for scope, _ in sockets} == {"loopback"}, sockets
    assert not [env for env in environments if b"DbPw-in-env" in env]


def test_the_demos_airflow_listens_on_loopback_with_a_password_of_its_own():
    from ledgerbatch.dev import airflow_demo

    setup = SimpleNamespace(db_url="postgresql+psycopg2://postgres@127.0.0.1:5432/ledgerbatch_demo",
                            broker=SimpleNamespace(bootstrap_servers="127.0.0.1:9092"),
                            registry=SimpleNamespace(url="http://127.0.0.1:8081"))
    home = Path(tempfile.mkdtemp(prefix="ledgerbatch-demo-test-"))
    env = airflow_demo.airflow_env(setup, home, f"sqlite:///{home}/airflow.db", 18080)
    # What Airflow itself resolves under the demo's environment: where `airflow standalone` binds its API server.
    host = subprocess.run([sys.executable, "-c", "from airflow.configuration import conf; print(conf.get('api', 'host'))"],
                          env=env, capture_output=True, text=True, timeout=120, check=True).stdout.split()[-1]
    assert host == "127.0.0.1"
    assert "127.0.0.1:18080" in env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]
    passwords = {subprocess.run([sys.executable, "-c", "from ledgerbatch.dev.airflow_demo import PASSWORD; print(PASSWORD)"],
                                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "plugins")}, capture_output=True,
                                text=True, timeout=120, check=True).stdout.split()[-1] for _ in range(2)}
    assert len(passwords) == 2 and "ledgerbatch" not in passwords


def test_compose_publishes_every_port_on_loopback():
    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    published = [(name, str(port)) for name, svc in compose["services"].items() for port in svc.get("ports", [])]
    assert published and all(port.startswith("127.0.0.1:") for _, port in published), published

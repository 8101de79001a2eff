"""Where the process task finds a Spark Connect server, and the command that starts one from the wheel."""
from __future__ import annotations

import json

import pytest

from ledgerbatch.spark.server import CONNECT_SERVER_CLASS, connect_server_command


def test_the_spark_connect_connection_names_the_server(monkeypatch):
    from ledgerbatch.airflow.hooks import spark_connect_url

    monkeypatch.setenv("LEDGERBATCH_SPARK_REMOTE", "sc://elsewhere:15002")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", json.dumps(
        {"conn_type": "spark_connect", "host": "spark-connect", "port": 15002, "login": "etl", "password": "s3cret"}))
    assert spark_connect_url() == "sc://spark-connect:15002/;user_id=etl;token=s3cret"


def test_without_the_connection_LEDGERBATCH_SPARK_REMOTE_then_spark_submit(monkeypatch):
    from ledgerbatch.airflow.hooks import spark_connect_url

    monkeypatch.delenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", raising=False)
    monkeypatch.setenv("LEDGERBATCH_SPARK_REMOTE", "sc://127.0.0.1:15002")
    assert spark_connect_url() == "sc://127.0.0.1:15002"
    monkeypatch.delenv("LEDGERBATCH_SPARK_REMOTE")
    assert spark_connect_url() is None


def test_the_cli_takes_LEDGERBATCH_SPARK_REMOTE_unless_a_master_is_given(monkeypatch):
    from ledgerbatch.cli import _spark_factory, build_parser
    from ledgerbatch.config import Settings

    monkeypatch.setenv("LEDGERBATCH_SPARK_REMOTE", "sc://127.0.0.1:15002")
    settings = Settings.from_env()
    assert settings.spark_remote == "sc://127.0.0.1:15002"
    seen = []
    monkeypatch.setattr("ledgerbatch.spark.session.get_spark", lambda *a, **kw: seen.append((a, kw)) or _Session())
    _spark_factory(build_parser().parse_args(["run", "orders"]), settings, "app")()
    _spark_factory(build_parser().parse_args(["run", "orders", "--master", "local[2]"]), settings, "app")()
    assert seen == [((), {"app_name": "app", "remote": "sc://127.0.0.1:15002"}), (("local[2]", "app"), {})]


class _Session:
    def stop(self) -> None:
        pass


def test_the_server_command_is_the_wheels_spark_connect_server():
    cmd = connect_server_command(15123, "127.0.0.1", "local[2]")
    assert cmd[0].endswith("spark-submit") and cmd[1:3] == ["--class", CONNECT_SERVER_CLASS]
    assert "spark.connect.grpc.binding.port=15123" in cmd and cmd[cmd.index("--master") + 1] == "local[2]"


def test_a_spark_connect_url_that_names_a_session_is_refused():
    from ledgerbatch.spark.connect import connect_session
    from ledgerbatch.errors import ConfigError

    with pytest.raises(ConfigError, match="names a session"):
        connect_session("sc://127.0.0.1:15002/;session_id=0b0e5c6e-5d1c-4c8e-9d0e-3a3b0b1d2c4f", keep="live:orders")


def test_kept_session_ids_differ_by_pipeline_generation_and_day():
    import datetime as dt

    from ledgerbatch.spark.connect import kept_session_id

    day = dt.date(2026, 11, 23)
    ids = {kept_session_id(n, g, d) for n in ("live:a", "live:b") for g in (0, 1) for d in (day, day + dt.timedelta(1))}
    assert len(ids) == 8 and kept_session_id("live:a", 0, day) == kept_session_id("live:a", 0, day)


def test_a_local_masters_parallelism_is_set_on_the_server():
    cmd = connect_server_command(15123, "127.0.0.1", "local[3]")
    assert "spark.default.parallelism=3" in cmd
    assert not any(c.startswith("spark.default.parallelism") for c in connect_server_command(master="spark://m:7077"))

"""Trust boundaries that need a real Spark session (issue #51)."""
import pytest


def test_sessions_ledgerbatch_starts_read_no_files(spark, tmp_path):
    """Besides the spec-load refusal (spec/sql_rights.py), Spark itself refuses a file relation."""
    secret = tmp_path / "secret.txt"
    secret.write_text("not for transforms\n")
    assert spark.conf.get("spark.sql.runSQLOnFiles") == "false"
    with pytest.raises(Exception, match="TABLE_OR_VIEW_NOT_FOUND"):
        spark.sql(f"SELECT * FROM text.`{secret}`").collect()


def test_a_local_sessions_ui_listens_on_loopback_and_cannot_kill(spark):
    from pathlib import Path

    port = int(spark.sparkContext.uiWebUrl.rsplit(":", 1)[1])
    listening = [line.split()[1].rsplit(":", 1)[0] for path in ("/proc/net/tcp", "/proc/net/tcp6")
                 for line in Path(path).read_text().splitlines()[1:]
                 if line.split()[3] == "0A" and int(line.split()[1].rsplit(":", 1)[1], 16) == port]
    loopback = ("0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F")
    assert listening and all(address in loopback for address in listening), listening
    assert spark.conf.get("spark.ui.killEnabled") == "false"


def test_sessions_ledgerbatch_starts_substitute_no_variables(spark, monkeypatch):
    """Besides the spec-load refusal of `${` (spec/sql_rights.py), Spark itself leaves ${env:...} as text."""
    monkeypatch.setenv("LB_SUBSTITUTION_PROBE", "from the environment")
    assert spark.conf.get("spark.sql.variable.substitute") == "false"
    assert spark.sql("SELECT '${env:LB_SUBSTITUTION_PROBE}' AS v").collect()[0].v == "${env:LB_SUBSTITUTION_PROBE}"

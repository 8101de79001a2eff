"""docker/compose.yaml without Docker: the Airflow services get the same settings through connections that
the CLI reads from the environment, and every path they name exists in the image's copy of the repo."""
import json
import os
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
IMAGE_ROOT = "/opt/ledgerbatch/"  # WORKDIR of docker/Dockerfile, where `COPY . .` puts the repo
COMPOSE = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
AIRFLOW = {"airflow-apiserver": "api-server", "airflow-scheduler": "scheduler",
           "airflow-dag-processor": "dag-processor", "airflow-triggerer": "triggerer"}


def test_airflow_3_services_and_the_one_shot_init():
    assert {name: SERVICES[name]["command"][1] for name in AIRFLOW} == AIRFLOW
    assert SERVICES["kafka"]["image"].startswith("apache/kafka:")
    assert SERVICES["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    for name in AIRFLOW:
        assert SERVICES[name]["depends_on"]["init"] == {"condition": "service_completed_successfully"}
    init = SERVICES["init"]["command"][0]
    assert os.access(REPO / init.removeprefix(IMAGE_ROOT), os.X_OK)


def test_paths_named_in_the_stack_exist_in_the_repo():
    env = SERVICES["airflow-scheduler"]["environment"]
    for path in (env["AIRFLOW__CORE__DAGS_FOLDER"], env["AIRFLOW__CORE__PLUGINS_FOLDER"]):
        assert (REPO / path.removeprefix(IMAGE_ROOT)).is_dir(), path
    (mount,) = [v for v in SERVICES["postgres"]["volumes"] if v.startswith("./")]
    assert (REPO / "docker" / mount.split(":")[0]).is_file()


@pytest.mark.parametrize("service", sorted(AIRFLOW))
def test_connections_match_the_cli_environment(service, monkeypatch):
    from ledgerbatch.airflow.hooks import settings_from_connections
    from ledgerbatch.config import Settings

    env = SERVICES[service]["environment"]
    for key, value in env.items():
        monkeypatch.setenv(key, str(value).replace("${SPARK_MASTER:-local[*]}", "local[*]"))
    from_connections = settings_from_connections("ledgerbatch_db", "ledgerbatch_kafka", "pipelines")
    from_env = Settings.from_env()
    assert from_connections.db_url == from_env.db_url
    assert from_connections.bootstrap_servers == from_env.bootstrap_servers
    assert from_connections.kafka_options == from_env.kafka_options
    assert json.loads(os.environ["AIRFLOW_CONN_SPARK_DEFAULT"]) == {"conn_type": "spark", "host": "local[*]"}

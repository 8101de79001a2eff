#!/usr/bin/env bash
# One-shot init: Airflow's metadata, the ledger migrations, the demo topic with data, the UI password,
# and a check that the connections the DAGs use resolve. Safe to run again.
set -euo pipefail
airflow db migrate
ledgerbatch migrate
python /opt/ledgerbatch/docker/demo_topic.py
echo '{"admin": "ledgerbatch"}' > "$AIRFLOW_HOME/passwords.json"
python - <<'PY'
from ledgerbatch.airflow.hooks import settings_from_connections
from ledgerbatch.config import safe_url

s = settings_from_connections("ledgerbatch_db", "ledgerbatch_kafka", "/opt/ledgerbatch/pipelines")
print(f"connections: ledgerbatch_db -> {safe_url(s.db_url)}, ledgerbatch_kafka -> {s.bootstrap_servers}")
PY
echo "init done: open http://localhost:8080 (admin / ledgerbatch)"

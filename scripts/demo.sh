#!/usr/bin/env bash
# Set up, then run the platform on the embedded defaults: a real Apache Kafka with known orders (and bad
# records), Airflow standalone with the demo DAG triggered until caught up, a SQL report, and the UI
# left running until Ctrl-C. `scripts/demo.sh --no-airflow` runs the same data path once without Airflow.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
exec ledgerbatch demo "$@"

#!/usr/bin/env bash
# Set up, then run every test: unit, and integration on real PostgreSQL, real Apache Kafka and local Spark.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
exec python -m pytest "$@"  # testpaths (pyproject.toml) is tests/ when no path is given

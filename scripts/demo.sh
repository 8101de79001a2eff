#!/usr/bin/env bash
# Set up, then run the demo end to end: dev broker, known orders with bad records, `ledgerbatch run`, SQL report.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
exec ledgerbatch demo "$@"

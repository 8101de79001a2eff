"""Airflow adapters: hooks own the clients, operators do I/O only in `execute`, the factory builds DAGs."""

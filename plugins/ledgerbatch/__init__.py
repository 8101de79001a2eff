"""ledgerbatch: exactly-once Kafka -> PostgreSQL batches driven by an offset ledger."""

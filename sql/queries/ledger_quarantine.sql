-- ledger.quarantine: bad records of committed batches. Run only by plugins/ledgerbatch/ledger/quarantine.py.
-- Bind parameters are :name; {placeholders} take quoted identifiers only.

-- name: insert_quarantine
INSERT INTO ledger.quarantine (batch_id, pipeline, topic, partition, "offset", key, value, error)
SELECT :batch_id, :pipeline, _topic, _partition, _offset, _key, _value, _error
FROM ledger_staging.{bad};

-- name: delete_quarantine_in_ranges
DELETE FROM ledger.quarantine q USING ledger.batch_ranges r
WHERE r.batch_id = :batch_id AND q.pipeline = r.pipeline AND q.topic = r.topic AND q.partition = r.partition
  AND q."offset" >= r.from_offset AND q."offset" < r.until_offset;

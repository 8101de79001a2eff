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

-- name: quarantine_rejects
-- The refused rows, as JSON of what the target was given, with the server's reason; their raw records
-- stay in Kafka at these coordinates (a replay reads them again). The server's detail holds the row's values:
-- it goes to error_detail, which the inspector may not read (migration 019).
INSERT INTO ledger.quarantine (batch_id, pipeline, topic, partition, "offset", value, error, sqlstate, constraint_name,
                               error_detail)
SELECT :batch_id, :pipeline, u._topic, u._partition, u._offset,
       convert_to((to_jsonb(u) - '_unit' - '_batch_id')::text, 'UTF8'),
       'refused by the target: ' || r.message, r.sqlstate, r.constraint_name, r.detail
FROM ledger_staging.{units} u
JOIN unnest(CAST(:units AS bigint[]), CAST(:sqlstates AS text[]), CAST(:constraints AS text[]),
            CAST(:messages AS text[]), CAST(:details AS text[])) AS r(unit, sqlstate, constraint_name, message, detail)
  ON u._unit = r.unit;

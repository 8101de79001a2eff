-- Record values out of what the inspector reads (issue #51). The server's detail of a refused row apart from
-- its reason: PostgreSQL's DETAIL of a CHECK or NOT NULL refusal is the whole row ("Failing row contains
-- (...)", "Partition key of the failing row contains ..."), of a unique one the key ("Key (id)=(5) already
-- exists."): the record's own values. `error` keeps the reason (what the inspector reads); `error_detail` is
-- not granted to ledgerbatch_inspector (017 grants it the quarantine's columns by name), as the record's key
-- and value are not.
ALTER TABLE ledger.quarantine ADD COLUMN IF NOT EXISTS error_detail text;

-- Refusals quarantined before 019 kept the detail in `error`, after the reason, in parentheses.
UPDATE ledger.quarantine
SET error_detail = substring(error FROM ' \(((Failing row contains |Partition key of the failing row contains |Key \().*)\)$'),
    error = regexp_replace(error, ' \((Failing row contains |Partition key of the failing row contains |Key \().*\)$', '')
WHERE starts_with(error, 'refused by the target: ')
  AND error ~ ' \((Failing row contains |Partition key of the failing row contains |Key \().*\)$';

-- Bad records' reasons named an excerpt of the value before 019 (`field card: expected an integer, got "4111-..."`);
-- now they say what it is, not what it holds (formats/convert.py: show). Older ones keep their words in
-- error_detail, and their quoted values and numbers masked in error, as ledger.quarantine_summary masks them.
UPDATE ledger.quarantine
SET error_detail = error,
    error = regexp_replace(error, '"([^"\\]|\\.)*"|(?<![\w-])\d+\M', '…', 'g')
WHERE sqlstate IS NULL AND error_detail IS NULL AND error ~ '"|\d';

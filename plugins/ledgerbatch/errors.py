"""Error types. Every message is one line a user can act on."""


class LedgerbatchError(Exception):
    """Base of every error the CLI reports as a one-line message."""


def require(value: str | None, what: str) -> None:
    """An operator command's who or why must be given: `what` says which, e.g. "who pauses it (--by NAME)"."""
    if not value or not value.strip():
        raise LedgerbatchError(f"say {what}")


class FieldError(LedgerbatchError):
    """A value of a form (an Airflow DAG's Params) the task refuses: the message names the field and the value."""

    def __init__(self, field: str, value, why: str):
        super().__init__(f"{field} {value!r}: {why}" if value not in (None, "") else f"{field}: {why}")
        self.field, self.value = field, value


class DeliveredAgain(LedgerbatchError):
    """Moving a cursor back over offsets batches delivered: a replay re-delivers them, not the move. The message
    is the CLI's; airflow/user_errors.py says the same with the backfill DAG's fields."""

    def __init__(self, pipeline: str, topic: str, partition: int, from_offset: int, until_offset: int, delivered: int):
        super().__init__(
            f"{topic}[{partition}]: back from {until_offset} to {from_offset} would deliver {delivered} offsets of "
            f"[{from_offset}, {until_offset}) again, which batches delivered (or were lost): re-deliver them with "
            f"`ledgerbatch replay {pipeline} --topic {topic} --partitions {partition} --from-offset {from_offset} "
            f"--until-offset {until_offset}`, which replaces what they left as the target mode demands")
        self.pipeline, self.topic, self.partition = pipeline, topic, partition
        self.from_offset, self.until_offset, self.delivered = from_offset, until_offset, delivered


class BatchOpen(LedgerbatchError):
    """An offsets move while a live batch is open: its ranges start at the cursors. The message is the CLI's;
    airflow/user_errors.py says the same with the pipeline's DAG."""

    def __init__(self, pipeline: str, batch_id: int, status: str):
        super().__init__(
            f"{pipeline}: batch {batch_id} is open ({status}) and its ranges start at the cursors: let it finish "
            f"(`ledgerbatch run {pipeline}`) or abandon it (`ledgerbatch abandon {pipeline} {batch_id} --by NAME`) "
            f"first; a pipeline that plans again at once (followed, or scheduled often): `ledgerbatch pause "
            f"{pipeline}` first, move the offsets once its batch is done, then `ledgerbatch resume {pipeline}`")
        self.pipeline, self.batch_id, self.status = pipeline, batch_id, status


class ConfigError(LedgerbatchError):
    """Bad environment, connection settings or unreachable service."""


class UnavailableError(ConfigError):
    """A dependency that did not answer (unreachable, down): waiting may fix it (ops/outages.py)."""

    def __init__(self, message: str, dependency: str):
        super().__init__(message)
        self.dependency = dependency


class SpecError(LedgerbatchError):
    """A pipeline spec that does not validate."""


class FencedError(LedgerbatchError):
    """Another attempt owns the batch or moved the cursors: this one must stop."""


class ReconcileError(LedgerbatchError):
    """Counts that do not add up, or too many bad records: nothing is committed."""

    attempt: int | None = None  # the attempt whose staged result was checked, where the commit knew it


class SpecVersionError(LedgerbatchError):
    """A batch planned under one version of its pipeline spec is resumed under another."""


class DataLossError(LedgerbatchError):
    """Offsets the ledger needs are no longer in Kafka."""


class BatchFailedError(LedgerbatchError):
    """Processing a batch failed; the ledger records why and the batch stays unfinished."""


# Markers that cross Spark as text: a Python worker's exception reaches the driver only as its message,
# so the raiser writes the marker and process.process_batch looks for it.
FENCED = "no longer owns the batch"
OFFSETS_LOST = "offsets are no longer in Kafka"
# A batch that failed errors.max_ratio on its own is planned again (plan/live.py) rather than resumed with
# its ranges: the ledger's error text carries the marker (model/reconcile.py writes it).
OVER_BUDGET = "more than errors.max_ratio"


class RowsRefusedError(LedgerbatchError):
    """The target refused rows of a batch and errors.on_reject is fail: nothing was written."""

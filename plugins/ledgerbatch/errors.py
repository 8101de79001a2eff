"""Error types. Every message is one line a user can act on."""


class LedgerbatchError(Exception):
    """Base of every error the CLI reports as a one-line message."""


def require(value: str | None, what: str) -> None:
    """An operator command's who or why must be given: `what` says which, e.g. "who pauses it (--by NAME)"."""
    if not value or not value.strip():
        raise LedgerbatchError(f"say {what}")


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

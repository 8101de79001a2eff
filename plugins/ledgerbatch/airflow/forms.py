"""The DAG forms' values as the package's requests, checked where one field depends on another (which a
form's JSON schema cannot say): each refusal is a FieldError naming the form's field, by its title, and the
value. Partitions come as text (`0, 3` or `0-3`: model/partition_list.py)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ledgerbatch.errors import FieldError, LedgerbatchError
from ledgerbatch.model.partition_list import parse_partitions
from ledgerbatch.model.times import before_time, epoch_ms
from ledgerbatch.ops.offsets import Target
from ledgerbatch.plan.replay import ReplayRequest, request_from_params
from ledgerbatch.spec.pipeline import PipelineSpec


def partitions(params: dict) -> tuple[int, ...] | None:
    text = params.get("partitions")
    try:
        return parse_partitions(text)
    except LedgerbatchError as exc:
        raise FieldError("Partitions", text, str(exc).removeprefix(f"partitions {text!r}: ")) from None


def _time(params: dict, key: str, title: str) -> int | None:
    try:
        return epoch_ms(params.get(key))
    except LedgerbatchError:
        raise FieldError(title, params.get(key), "is not an ISO-8601 time such as 2026-01-31T12:00:00") from None


def replay_request(spec: PipelineSpec, params: dict) -> ReplayRequest:
    """The backfill form's values as a replay request: From/Until offset or From/Until time, each pair whole."""
    start, until = params.get("from_offset"), params.get("until_offset")
    start_ms = _time(params, "from_time", "From time")
    until_ms = _time(params, "until_time", "Until time")
    by_offset, by_time = (start, until) != (None, None), (start_ms, until_ms) != (None, None)
    if by_offset == by_time:
        raise FieldError("From offset", start, "fill in From offset and Until offset, or From time and Until "
                         "time, not both" if by_offset else "fill in From offset and Until offset, or From time "
                         "and Until time")
    if by_offset:
        if start is None or until is None:
            raise FieldError("Until offset" if until is None else "From offset", None, "fill in both offsets")
        if start < 0:
            raise FieldError("From offset", start, "must be 0 or more")
        if until <= start:
            raise FieldError("Until offset", until, f"must be above From offset ({start}): the range is "
                             f"[From offset, Until offset)")
    elif start_ms is None or until_ms is None:
        raise FieldError("Until time" if until_ms is None else "From time", None, "fill in both times")
    elif until_ms <= start_ms:
        raise FieldError("Until time", params.get("until_time"),
                         f"must be after From time ({params.get('from_time')})")
    return request_from_params(spec, {**params, "partitions": partitions(params)})


@dataclass(frozen=True)
class MoveRequest:
    """The offsets form's values as set_offsets' arguments."""
    target: Target
    topic: str | None
    partitions: list[int] | None
    by: str
    reason: str
    dry_run: bool


def move_request(params: dict) -> MoveRequest:
    """The offsets form's values; Move to = time or offset needs its Time or Offset."""
    to = params.get("to")
    if to == "time" and not params.get("to_time"):
        raise FieldError("Time", None, "Move to = time needs a Time; or choose Move to = latest, earliest or offset")
    if to == "offset" and params.get("to_offset") is None:
        raise FieldError("Offset", None, "Move to = offset needs an Offset; or choose Move to = latest, earliest "
                         "or time")
    if to == "offset" and params["to_offset"] < 0:
        raise FieldError("Offset", params["to_offset"], "must be 0 or more")
    if to == "time":
        _time(params, "to_time", "Time")
    chosen = partitions(params)
    return MoveRequest(Target(time=params.get("to_time") if to == "time" else None,
                              offset=params.get("to_offset") if to == "offset" else None,
                              earliest=to == "earliest", latest=to == "latest"),
                       params.get("topic") or None, list(chosen) if chosen else None,
                       params.get("by") or "", params.get("reason") or "", bool(params.get("dry_run")))


def before(value: str | None, title: str) -> datetime | None:
    """The history form's Compact before / Purge quarantine before (empty: none)."""
    if not value or value == "None":  # the template renders an empty field as "None"
        return None
    try:
        return before_time(value)
    except LedgerbatchError:
        raise FieldError(title, value, "is neither an ISO-8601 time (2026-01-31 or 2026-01-31T12:00:00) nor an "
                         "age such as 30d, 12h or 90m") from None


def history_request(compact_before: str | None, purge_before: str | None,
                    dry_run: bool | str) -> tuple[datetime | None, datetime | None, bool]:
    """The history form's values (as templated: text); Dry run previews Purge quarantine before alone."""
    compact, purge = before(compact_before, "Compact before"), before(purge_before, "Purge quarantine before")
    dry = str(dry_run).lower() in ("true", "1")
    if dry and compact is not None:
        raise FieldError("Compact before", compact_before, "has no dry run (compaction loses no count): empty it, "
                         "or turn Dry run off")
    if dry and purge is None:
        raise FieldError("Purge quarantine before", None, "Dry run counts what this purge would drop: fill it in")
    return compact, purge, dry

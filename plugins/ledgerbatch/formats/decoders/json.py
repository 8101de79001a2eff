"""`format: json`: each value is one UTF-8 JSON object; numbers with a fraction stay exact (Decimal)."""
from __future__ import annotations

import json
from decimal import Decimal

from ledgerbatch.formats.bad_value import BadValue


def reject_constant(name: str):
    raise BadValue(f"value is not valid JSON: {name} is not a JSON number")


# One decoder for every record: json.loads with options would build a new one per call.
_DECODER = json.JSONDecoder(parse_float=Decimal, parse_constant=reject_constant)


class JsonDecoder:
    """Takes no options: a JSON value describes itself."""

    def __init__(self, options: dict):
        pass

    def decode(self, raw: bytes | None) -> dict:
        if raw is None:
            raise BadValue("null value (tombstone)")
        if not raw:
            raise BadValue("empty value")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadValue(f"value is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        try:
            # raw_decode spares decode()'s two whitespace scans; anything around the value (whitespace,
            # extra data) goes through decode() and its exact rules and messages.
            obj, end = _DECODER.raw_decode(text) if text[0] not in " \t\n\r" else (None, -1)
            if end != len(text):
                obj = _DECODER.decode(text)
        except BadValue:  # NaN, Infinity: already says why
            raise
        except RecursionError:
            raise BadValue("value is not valid JSON: nested too deeply") from None
        except json.JSONDecodeError as exc:
            raise BadValue(f"value is not valid JSON: {exc.msg} at char {exc.pos}") from None
        except ValueError as exc:  # e.g. an integer literal longer than Python's digit limit
            raise BadValue(f"value is not valid JSON: {exc}") from None
        except ArithmeticError:  # decimal.InvalidOperation: an exponent past Decimal's (±999999999999999999)
            raise BadValue("value is not valid JSON: a number's exponent is out of range") from None
        if not isinstance(obj, dict):
            raise BadValue(f"value is JSON {type(obj).__name__ if obj is not None else 'null'}, not an object")
        return obj

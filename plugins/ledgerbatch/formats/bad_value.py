"""The per-record failure every decoder and converter raises: the record is quarantined with this reason."""
from __future__ import annotations


class BadValue(ValueError):
    """Why a record is quarantined; `path` locates the value inside a nested field."""

    def __init__(self, message: str, path: tuple[str, ...] = ()):
        super().__init__(message)
        self.path = path

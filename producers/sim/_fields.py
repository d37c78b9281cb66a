"""A mapping read field by field with a dotted path, so every ConfigError names the exact field
(``faults[2].start_s``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peerwatch.errors import ConfigError


class Section:
    """A mapping read with a dotted path, so every error names the exact field."""

    def __init__(self, data: object, path: str) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(path or "scenario", "expected a table/object")
        self.data: Mapping[str, Any] = data
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def reject_unknown(self, allowed: set[str]) -> None:
        for key in self.data:
            if key not in allowed:
                raise ConfigError(self.at(str(key)), f"unknown field (allowed: {sorted(allowed)})")

    def num(self, key: str, default: float | None, lo: float | None = None,
            hi: float | None = None, integer: bool = False) -> Any:  # fmt: skip
        value = self.data.get(key, default)
        if value is None:
            if default is None and key in self.data:
                return None
            if default is None:
                raise ConfigError(self.at(key), "required")
            value = default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(self.at(key), f"expected a number, got {value!r}")
        if integer and value != int(value):
            raise ConfigError(self.at(key), f"expected an integer, got {value!r}")
        if lo is not None and value < lo:
            raise ConfigError(self.at(key), f"must be >= {lo}, got {value!r}")
        if hi is not None and value > hi:
            raise ConfigError(self.at(key), f"must be <= {hi}, got {value!r}")
        return int(value) if integer else float(value)

    def text(self, key: str, default: str | None) -> str:
        value = self.data.get(key, default)
        if value is None:
            raise ConfigError(self.at(key), "required")
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # job ids are often written as numbers
        if not isinstance(value, str) or not value:
            raise ConfigError(self.at(key), f"expected a non-empty string, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(self.at(key), f"expected true or false, got {value!r}")
        return value

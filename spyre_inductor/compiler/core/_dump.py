"""describe(): a plan dataclass as plain JSON-able data (for artifacts and tests)."""

from __future__ import annotations

import dataclasses
import enum


def plain(value):
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (set, frozenset)):  # a tile's space: its axes, in a stable order
        return sorted(plain(v) for v in value)
    return value


class Describable:
    def describe(self) -> dict:
        return plain(self)

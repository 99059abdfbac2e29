"""describe(): a plan dataclass as plain JSON-able data (for artifacts and tests)."""

from __future__ import annotations

import dataclasses


def plain(value):
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (set, frozenset)):  # a tile's space: the axes it varies over
        return sorted(plain(v) for v in value)
    return value


class Describable:
    def describe(self) -> dict:
        return plain(self)

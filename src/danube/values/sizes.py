"""Sizes in configuration: bytes, or a number with a binary suffix (spec/memory.md)."""

from __future__ import annotations

import re

KIB, MIB, GIB = 1024, 1024 * 1024, 1024 * 1024 * 1024

_UNITS = {
    "": 1,
    "b": 1,
    "k": KIB,
    "kb": KIB,
    "kib": KIB,
    "m": MIB,
    "mb": MIB,
    "mib": MIB,
    "g": GIB,
    "gb": GIB,
    "gib": GIB,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: object, where: str) -> int:
    """Bytes from an int or a string with a binary suffix (`512MiB`, `2G`, `65536`); the
    suffixes K, M, G and their KB/KiB spellings all mean powers of 1024."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected a size in bytes, got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(str(value))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(f"{where}: expected a size such as 512MiB or 2G, got {value!r}")
        size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"{where}: must be positive, got {value!r}")
    return size

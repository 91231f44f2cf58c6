"""Reference implementations the dispatch tests compare against."""

from __future__ import annotations


def glob_match(pattern: bytes, key: bytes) -> bool:
    """Reference matcher, independent of `KeyFilter` (no regex): the set of key positions
    reachable after each pattern byte. `*` any run (empty too), `?` exactly one byte, every
    other byte literal, and the whole key must be consumed."""
    reachable = {0}
    for symbol in pattern:
        if symbol == ord("*"):
            start = min(reachable, default=len(key) + 1)
            reachable = set(range(start, len(key) + 1))
        elif symbol == ord("?"):
            reachable = {j + 1 for j in reachable if j < len(key)}
        else:
            reachable = {j + 1 for j in reachable if j < len(key) and key[j] == symbol}
        if not reachable:
            return False
    return len(key) in reachable

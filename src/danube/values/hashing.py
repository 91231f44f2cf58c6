"""Hashes that clients and broker must agree on bit for bit.

FNV-1a 64 routes keyed messages to partitions in every official client; the Key-Shared ring
folds the same hash to 32 bits and finishes it with murmur3's fmix32, as Danube does, so a key
lands on the same virtual node here as there.
"""

from __future__ import annotations

FNV_OFFSET_BASIS = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1


def fnv1a_64(data: bytes) -> int:
    value = FNV_OFFSET_BASIS
    for byte in data:
        value = ((value ^ byte) * FNV_PRIME) & _MASK64
    return value


def fmix32(value: int) -> int:
    value ^= value >> 16
    value = (value * 0x85EBCA6B) & _MASK32
    value ^= value >> 13
    value = (value * 0xC2B2AE35) & _MASK32
    value ^= value >> 16
    return value


def ring_hash(data: bytes) -> int:
    """FNV-1a 64, xor-folded to 32 bits, then fmix32: the Key-Shared ring position."""
    wide = fnv1a_64(data)
    return fmix32((wide >> 32) ^ (wide & _MASK32))


def partition_for_key(key: str, partitions: int) -> int:
    return fnv1a_64(key.encode()) % partitions

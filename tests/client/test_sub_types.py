"""Subscription-type names as people and tools spell them (danube-cli, the load generator)."""

from __future__ import annotations

import pytest

from danube.client import SubType


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("exclusive", SubType.EXCLUSIVE),
        (" Shared ", SubType.SHARED),
        ("fail-over", SubType.FAILOVER),
        ("failover", SubType.FAILOVER),
        ("key-shared", SubType.KEY_SHARED),
        ("Key_Shared", SubType.KEY_SHARED),
    ],
)
def test_every_spelling_names_its_type(text: str, kind: SubType) -> None:
    assert SubType.named(text) is kind


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="one of exclusive, shared, failover, key_shared"):
        SubType.named("round-robin")

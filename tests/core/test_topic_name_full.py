"""`TopicName.full` is stored once at construction (the core reads it several times per
message): it must stay the name's `/namespace/local` through every way a name is made, and
stay out of equality, hashing and the repr (it is derived, not a part)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from danube.values.names import TopicName, parse_topic


def test_full_is_the_slash_joined_name_however_the_name_is_made() -> None:
    name = TopicName("default", "orders")
    assert name.full == "/default/orders"
    assert parse_topic("/default/orders").full == "/default/orders"
    assert dataclasses.replace(name, local="bills").full == "/default/bills"
    assert pickle.loads(pickle.dumps(name)).full == "/default/orders"


def test_full_is_derived_not_compared_and_frozen() -> None:
    name = TopicName("default", "orders")
    assert name == TopicName("default", "orders")
    assert hash(name) == hash(TopicName("default", "orders"))
    assert repr(name) == "TopicName(namespace='default', local='orders')"
    with pytest.raises(dataclasses.FrozenInstanceError):
        name.full = "/other/topic"  # type: ignore[misc]

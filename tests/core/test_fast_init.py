"""`danube.values.frozen.fast_init` gives a frozen, slotted dataclass an `__init__` that does
what the dataclass's own does (signature, defaults, factories, keyword-only fields,
`__post_init__`), only faster; the class stays frozen."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import InitVar, dataclass, field

import pytest

from danube.effects import StoreTxn
from danube.machines.tiering.index import IndexEntry
from danube.values.frozen import fast_init


def shapes() -> tuple[type, type]:
    def make() -> type:
        @dataclass(frozen=True, slots=True)
        class Shape:
            a: int
            b: int = 2
            c: list[int] = field(default_factory=list)
            d: int = field(default=5, init=False)
            e: tuple[int, ...] = field(default_factory=tuple, init=False)
            f: int = field(default=0, kw_only=True)
            g: str = field(kw_only=True, default="g")

            def __post_init__(self) -> None:
                if self.a < 0:
                    raise ValueError("a < 0")

        return Shape

    return make(), fast_init(make())


CALLS = [((1,), {}), ((1, 3), {}), ((1, 3, [4]), {"f": 7}), ((1,), {"g": "x", "b": 9})]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_the_fast_init_builds_what_the_dataclass_builds(args: tuple, kwargs: dict) -> None:
    plain, fast = shapes()
    assert fast.__init__ is not plain.__init__
    built, expected = fast(*args, **kwargs), plain(*args, **kwargs)
    assert dataclasses.astuple(built) == dataclasses.astuple(expected)
    assert repr(built).split("(", 1)[1] == repr(expected).split("(", 1)[1]
    assert fast(*args, **kwargs) == built
    assert hash(dataclasses.replace(built, c=())) == hash(dataclasses.replace(built, c=()))


def test_signature_post_init_and_frozen_are_kept() -> None:
    plain, fast = shapes()
    assert [p.name for p in inspect.signature(fast).parameters.values()] == [
        p.name for p in inspect.signature(plain).parameters.values()
    ]
    assert fast(1).c is not fast(1).c  # a new list each time, as the factory promises
    with pytest.raises(ValueError):
        fast(-1)
    with pytest.raises(TypeError):
        fast(1, 2, [], 4)  # f is keyword-only
    with pytest.raises(TypeError):
        fast()
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast(1).a = 2  # type: ignore[misc]


def test_classes_it_cannot_handle_are_left_alone() -> None:
    @dataclass(slots=True)
    class Mutable:
        a: int

    @dataclass(frozen=True)
    class Unslotted:
        a: int

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        scale: InitVar[int] = 1

    for cls in (Mutable, Unslotted, WithInitVar):
        init = cls.__init__
        assert fast_init(cls).__init__ is init


def test_hot_effects_use_it() -> None:
    """The classes built on every simulated request (a profile's list) have it."""
    for cls in (StoreTxn, IndexEntry):
        assert any(name.startswith("_set_") for name in cls.__init__.__globals__)

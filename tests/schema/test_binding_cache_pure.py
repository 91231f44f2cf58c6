"""The schema gate's binding cache on a fake clock: trusted for the TTL, stale on failure
for another TTL, forgotten on a change through this broker, bounded."""

from __future__ import annotations

from danube.machines.requests.binding_cache import BindingCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_binding_is_trusted_for_the_ttl_then_read_again() -> None:
    clock = Clock()
    cache: BindingCache[str] = BindingCache(clock, ttl_s=1.0)
    assert cache.fresh("t") == (False, None)
    cache.read("t", "avro")
    clock.now = 0.99
    assert cache.fresh("t") == (True, "avro")
    clock.now = 1.0
    assert cache.fresh("t") == (False, None)


def test_a_failed_read_serves_the_cached_binding_for_another_ttl() -> None:
    clock = Clock()
    cache: BindingCache[str | None] = BindingCache(clock, ttl_s=1.0)
    assert cache.failed("t") == (False, None)
    cache.read("t", None)
    clock.now = 5.0
    assert cache.failed("t") == (True, None)
    clock.now = 5.5
    assert cache.fresh("t") == (True, None)
    cache.forget("t")
    assert cache.fresh("t") == (False, None)


def test_the_least_recently_read_topic_goes_first() -> None:
    cache: BindingCache[int] = BindingCache(Clock(), capacity=2)
    cache.read("a", 1)
    cache.read("b", 2)
    cache.read("a", 3)
    cache.read("c", 4)
    assert cache.fresh("b") == (False, None)
    assert cache.fresh("a") == (True, 3) and cache.fresh("c") == (True, 4)

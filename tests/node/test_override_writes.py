"""A topic's overrides whose write failed are written again by the core (the catalogue's
decision, `Catalogue.metadata_written` and `overrides_to_write_again`), at its ticks, until
one write is stored: the drivers used to run a loop each (the runtime's admin services and
the simulator's operator), which the simulator could not see as the broker's own."""

from __future__ import annotations

from typing import Any

from danube.effects import StoreTxn
from danube.machines.node.catalogue import Catalogue
from danube.machines.node.core import PersistMeta
from tests.node.test_core_reliable import REL, TOPIC, Broker

KEY = f"/topics{TOPIC}/policy"
AGAIN = Catalogue.WRITE_AGAIN_MS


class _Failing:
    """Makes the memory port's metadata writes fail (as a store that does not answer)."""

    def __init__(self, broker: Broker) -> None:
        self.on = False
        self.writes = 0
        port = broker.driver.port
        answer = port.answer

        def failing(effect: Any) -> Any:
            if isinstance(effect, StoreTxn):
                self.writes += 1
                if self.on:
                    raise ConnectionError("the store did not answer")
            return answer(effect)

        port.answer = failing  # type: ignore[method-assign]


def _policy_writes(effects: list[Any]) -> list[PersistMeta]:
    return [e for e in effects if isinstance(e, PersistMeta) and KEY in e.keys]


def _tick(broker: Broker, now_ms: int) -> list[PersistMeta]:
    broker.driver.now_ms = now_ms
    return _policy_writes(broker.run(broker.core.tick(now_ms).effects))


def _failed_override_write() -> tuple[Broker, _Failing, int]:
    """A broker whose write of the topic's overrides (`max_producers_per_topic` 9) failed;
    the store still refuses writes. Returns it, the refusing store and when it happened."""
    broker = Broker()
    broker.producer()
    store = _Failing(broker)
    start = broker.driver.now_ms
    store.on = True
    broker.run(broker.core.set_topic_policies(TOPIC, {"max_producers_per_topic": 9}).effects)
    return broker, store, start


def test_a_failed_override_write_is_written_again_every_interval_until_stored() -> None:
    broker, store, start = _failed_override_write()
    assert KEY not in broker.driver.metadata
    assert broker.core.topic_overrides(TOPIC) == {"max_producers_per_topic": 9}, "in force"
    assert broker.core.catalogue.overrides_unsaved() == {TOPIC: start + AGAIN}

    assert _tick(broker, start + AGAIN - 1) == [], "not before the interval"
    assert len(_tick(broker, start + AGAIN)) == 1, "written again"
    assert KEY not in broker.driver.metadata, "and failed again"
    assert broker.core.catalogue.overrides_unsaved() == {TOPIC: start + AGAIN + AGAIN}
    assert _tick(broker, start + 2 * AGAIN - 1) == []

    store.on = False
    assert len(_tick(broker, start + 2 * AGAIN)) == 1
    assert broker.driver.metadata[KEY] == {"max_producers_per_topic": 9}, "the store is memory"
    assert broker.core.catalogue.overrides_unsaved() == {}
    assert _tick(broker, start + 10 * AGAIN) == [], "stored: nothing more"


def test_one_write_again_at_a_time_and_a_later_stored_write_settles_it() -> None:
    """While a write again is under way no other is made; a later change stored (it holds
    the whole overrides) leaves nothing to write again, a later one failed marks them again."""
    broker, store, start = _failed_override_write()
    held: list[Any] = []
    broker.driver.port.hold = lambda effect: isinstance(effect, StoreTxn) and not held
    assert len(_tick(broker, start + AGAIN)) == 1
    assert broker.core.catalogue.overrides_unsaved() == {TOPIC: None}, "under way"
    assert _tick(broker, start + 5 * AGAIN) == [], "the one under way has no answer yet"
    held.append(True)
    broker.driver.finish_uploads()  # the held write fails: again an interval later
    assert broker.core.catalogue.overrides_unsaved() == {TOPIC: start + 6 * AGAIN}

    store.on = False
    broker.run(broker.core.set_topic_policies(TOPIC, {"max_consumers_per_topic": 3}).effects)
    assert broker.core.catalogue.overrides_unsaved() == {}
    assert broker.driver.metadata[KEY] == broker.core.topic_overrides(TOPIC)
    store.on = True
    broker.run(broker.core.clear_topic_policies(TOPIC).effects)
    assert broker.core.catalogue.overrides_unsaved() == {TOPIC: start + 6 * AGAIN}, "a clear too"
    store.on = False
    assert len(_tick(broker, start + 6 * AGAIN)) == 1
    assert KEY not in broker.driver.metadata


def test_no_write_again_once_the_topic_is_on_its_way_out() -> None:
    """Its next owner reads the store; the write would be refused (`NotOwner`) anyway."""
    broker, store, start = _failed_override_write()
    store.on = False
    broker.run(broker.core.unload(TOPIC, start).effects)
    assert _tick(broker, start + AGAIN) == []
    assert broker.core.catalogue.overrides_unsaved() == {}, "forgotten"


def test_other_writes_do_not_touch_the_marks() -> None:
    broker = Broker()
    broker.producer()
    store = _Failing(broker)
    store.on = True
    broker.run(
        broker.core.set_namespace_policies("default", {"max_producers_per_topic": 2}).effects
    )
    broker.run(broker.core.create_topic("/default/other", REL).effects)
    assert store.writes > 0
    assert broker.core.catalogue.overrides_unsaved() == {}

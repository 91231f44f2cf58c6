"""The registry's store flows (`danube.machines.schema.flows`), driven here against the metadata
store's own state machine: what the broker and the simulator both run."""

from __future__ import annotations

import json
from collections.abc import Generator
from typing import Any

import pytest

from danube.machines.schema import flows, records, registry
from danube.machines.schema.formats import ParsedSchema, SchemaType, parse
from danube.machines.schema.registry import Registration
from danube.metadata.state import MetadataState
from danube.values.errors import DanubeError, ErrorCode


def avro(*names: str) -> ParsedSchema:
    fields = [{"name": "id", "type": "long"}]
    fields += [{"name": n, "type": "string", "default": ""} for n in names]
    definition = json.dumps({"type": "record", "name": "R", "fields": fields}).encode()
    return parse(SchemaType.AVRO, definition)


def registering(schema: ParsedSchema, name: str = "orders") -> flows.Flow[Registration]:
    return flows.register(
        name, schema, registry.parse_version, now_ms=0, created_by="t", description="", tags=()
    )


class Driver:
    """Runs flows step by step, so a test can interleave two of them."""

    def __init__(self, state: MetadataState) -> None:
        self.state = state

    def answer(self, step: flows.Step) -> Any:
        if isinstance(step, flows.Read):
            return self.state.get(step.key)
        if isinstance(step, flows.Write):
            return self.state.txn(step.compares, step.ops)[0].succeeded
        return step.run()

    def until_write(self, flow: Generator[flows.Step, Any, Any], value: Any = None) -> Any:
        """Sends `value`, then answers steps until the flow asks to write; returns it."""
        step = flow.send(value)
        while not isinstance(step, flows.Write):
            step = flow.send(self.answer(step))
        return step

    def finish(self, flow: Generator[flows.Step, Any, Any], value: Any) -> Any:
        try:
            step = flow.send(value)
            while True:
                step = flow.send(self.answer(step))
        except StopIteration as done:
            return done.value


def test_two_registrations_racing_on_one_subject_get_distinct_versions() -> None:
    """Both read version 1, both decide version 2; the second write finds the subject
    changed, reads again and lands as version 3."""
    driver = Driver(MetadataState())
    assert driver.finish(registering(avro()), None).version.version == 1
    first, second = registering(avro("a")), registering(avro("b"))
    first_write = driver.until_write(first)
    second_write = driver.until_write(second)
    won = driver.finish(first, driver.answer(first_write))
    lost = driver.finish(second, driver.answer(second_write))
    assert (won.version.version, lost.version.version) == (2, 3)
    stored = driver.finish(flows.existing("orders"), None)[0]
    assert [v.fingerprint for v in stored.versions] == [
        avro().fingerprint,
        avro("a").fingerprint,
        avro("b").fingerprint,
    ]


def test_two_new_subjects_racing_get_distinct_ids() -> None:
    driver = Driver(MetadataState())
    first, second = registering(avro(), "a"), registering(avro(), "b")
    first_write, second_write = driver.until_write(first), driver.until_write(second)
    won = driver.finish(first, driver.answer(first_write))
    lost = driver.finish(second, driver.answer(second_write))
    assert (won.subject.schema_id, lost.subject.schema_id) == (1, 2)


def test_a_race_lost_every_time_ends_unavailable() -> None:
    driver = Driver(MetadataState())
    driver.finish(registering(avro()), None)
    flow = registering(avro("a"))
    step = driver.until_write(flow)
    with pytest.raises(DanubeError) as raised:
        for interloper in range(records.RACE_ATTEMPTS):
            driver.finish(registering(avro(f"x{interloper}")), None)
            step = driver.until_write(flow, driver.answer(step))
    assert raised.value.code is ErrorCode.UNAVAILABLE


def test_a_message_names_a_live_version_or_the_latest() -> None:
    driver = Driver(MetadataState())
    for names in ((), ("a",), ("b",)):
        driver.finish(registering(avro(*names)), None)
    driver.finish(flows.update("orders", lambda s: registry.delete_version(s, 2)), None)
    assert driver.finish(flows.named(1, 1), None)[1].version == 1
    assert driver.finish(flows.named(1, None), None)[1].version == 3
    assert driver.finish(flows.named(1, 2), None) is None
    assert driver.finish(flows.named(7, 1), None) is None

"""Avro's binary encoding read as a strict consumer reads it: `validate_datum` says whether a
payload is exactly one datum of a schema. Every value read pays a step from the budget in
force (`danube.machines.schema.budget`), so a payload of millions of values is refused with the
limit named rather than walked for seconds; the decoder keeps an explicit stack, so nesting costs
no Python recursion."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from danube.machines.schema import budget as budgets
from danube.machines.schema.avro_model import (
    _INT_BITS,
    AvroSchema,
    _Array,
    _At,
    _deref,
    _Enum,
    _Fixed,
    _Invalid,
    _is_empty,
    _Node,
    _Record,
    _Union,
)
from danube.machines.schema.limits import VALIDATION_CPU_SECONDS, VALIDATION_STEPS


def validate_datum(schema: AvroSchema, payload: bytes) -> str | None:
    """Whether `payload` is exactly one datum of `schema` in Avro's binary encoding, without
    the container or a schema id, as Kafka-style producers send it: None if so, else what is
    wrong and where. Stricter than fastavro's decoder (ints in range, booleans 0 or 1, enum
    and union indexes in range, UTF-8 strings), since any consumer must be able to read what
    is accepted; it never loops on a count it has not seen the bytes for, so a hostile
    payload costs time in proportion to its length, and no more steps than the budget in
    force (a fresh VALIDATION_STEPS one without): `LimitExceeded` beyond."""
    budget = budgets.current() or budgets.runtime().budget(
        VALIDATION_STEPS, "payload validation", "validation steps", VALIDATION_CPU_SECONDS
    )
    try:
        _Decoder(schema, payload, budget).run()
    except _Invalid as exc:
        return exc.message()
    return None


class _Decoder:
    """Reads one binary datum the way a strict consumer would, with an explicit stack of steps
    rather than recursion, so a long linked list is no deeper for Python than a flat record.
    A block count is believed only as far as the bytes left can hold its items, so a few
    bytes cannot make it loop for ages; items of types whose values take no bytes are not
    walked at all."""

    def __init__(self, schema: AvroSchema, data: bytes, budget: budgets.Budget) -> None:
        self._budget = budget
        self._schema = schema
        self._data = data
        self._pos = 0
        self._steps: list[Callable[[], None]] = []

    def run(self) -> None:
        self._steps.append(partial(self._value, self._schema._tree, None))
        spend = self._budget.spend
        while self._steps:
            spend()
            self._steps.pop()()
        left = len(self._data) - self._pos
        if left:
            raise _Invalid(
                None,
                f"the datum ends at byte {self._pos}, but the payload goes on for {left} more "
                "(trailing bytes)",
            )

    def _empty(self, node: _Node) -> bool:
        return _is_empty(node, self._schema._named, self._schema._empty)

    def _value(self, node: _Node, at: _At | None) -> None:
        node = _deref(node, self._schema._named)
        if self._empty(node):
            return
        if isinstance(node, str):
            self._primitive(node, at)
        elif isinstance(node, _Record):
            for declared in reversed(node.fields):
                self._steps.append(partial(self._value, declared.type, _At(at, declared.name)))
        elif isinstance(node, _Union):
            index = self._varint(at, "a union index", 32)
            if not 0 <= index < len(node.branches):
                raise _Invalid(
                    at,
                    f"union index {index} is out of range: the union has "
                    f"{len(node.branches)} branches",
                )
            self._steps.append(partial(self._value, node.branches[index], at))
        elif isinstance(node, _Enum):
            index = self._varint(at, "an enum index", 32)
            if not 0 <= index < len(node.symbols):
                raise _Invalid(
                    at,
                    f"enum index {index} is out of range: enum '{node.name}' has "
                    f"{len(node.symbols)} symbols",
                )
        elif isinstance(node, _Fixed):
            self._take(node.size, at, f"fixed '{node.name}'")
        elif isinstance(node, _Array):
            self._steps.append(partial(self._block, node.items, at, False, 0))
        else:
            self._steps.append(partial(self._block, node.values, at, True, 0))

    def _primitive(self, kind: str, at: _At | None) -> None:
        if kind == "boolean":
            byte = self._take(1, at, "a boolean")[0]
            if byte > 1:
                raise _Invalid(at, f"a boolean is the byte 0 or 1, not {byte}")
        elif kind in _INT_BITS:
            self._varint(at, "an int" if kind == "int" else "a long", _INT_BITS[kind])
        elif kind == "float":
            self._take(4, at, "a float")
        elif kind == "double":
            self._take(8, at, "a double")
        elif kind == "bytes":
            self._take(self._length(at, "bytes"), at, "bytes")
        else:
            self._string(at)

    def _string(self, at: _At | None) -> str:
        length = self._length(at, "a string")
        start = self._pos
        try:
            return self._take(length, at, "a string").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Invalid(
                at, f"the string is not UTF-8: {exc.reason} at byte {start + exc.start}"
            ) from None

    def _block(self, items: _Node, at: _At | None, is_map: bool, first: int) -> None:
        count = self._varint(at, "a block count", 64)
        if count == 0:
            return
        if count < 0:
            count = -count
            size = self._length(at, "a block")
            self._steps.append(partial(self._block, items, at, is_map, first + count))
            self._steps.append(partial(self._block_end, self._pos + size, at))
        else:
            self._steps.append(partial(self._block, items, at, is_map, first + count))
        if not is_map and self._empty(_deref(items, self._schema._named)):
            return
        left = len(self._data) - self._pos
        if count > left:
            raise _Invalid(
                at, f"a block claims {count} items, but only {left} bytes are left for them"
            )
        # The items are paid for before they are stacked, so a block of a million is refused
        # before it takes memory.
        self._budget.spend(count)
        for index in reversed(range(first, first + count)):
            if is_map:
                self._steps.append(partial(self._entry, items, at, index))
            else:
                self._steps.append(partial(self._value, items, _At(at, index)))

    def _block_end(self, end: int, at: _At | None) -> None:
        if self._pos != end:
            raise _Invalid(
                at, f"a block's byte size says it ends at byte {end}, its items end at {self._pos}"
            )

    def _entry(self, values: _Node, at: _At | None, index: int) -> None:
        key = self._string(_At(at, index))
        self._steps.append(partial(self._value, values, _At(at, key, is_key=True)))

    def _take(self, count: int, at: _At | None, what: str) -> bytes:
        left = len(self._data) - self._pos
        if count > left:
            raise _Invalid(
                at,
                f"the payload ends inside {what}: {count} bytes needed at byte {self._pos}, "
                f"{left} left",
            )
        self._pos += count
        return self._data[self._pos - count : self._pos]

    def _length(self, at: _At | None, what: str) -> int:
        length = self._varint(at, f"the length of {what}", 64)
        if length < 0:
            raise _Invalid(at, f"the length of {what} is negative ({length})")
        return length

    def _varint(self, at: _At | None, what: str, bits: int) -> int:
        """A zig-zag varint of at most `bits` bits, in at most as many bytes as those bits
        need, as Java's decoder reads them."""
        most = (bits + 6) // 7
        number = 0
        for shift in range(0, 7 * most, 7):
            if self._pos >= len(self._data):
                raise _Invalid(at, f"the payload ends inside {what} at byte {self._pos}")
            byte = self._data[self._pos]
            self._pos += 1
            number |= (byte & 0x7F) << shift
            if byte < 0x80:
                if number >> bits:
                    raise _Invalid(at, f"{what} does not fit in {bits} bits")
                return (number >> 1) ^ -(number & 1)
        raise _Invalid(at, f"{what} runs over {most} bytes")

"""Avro schema resolution: can a reader schema read what a writer schema wrote
(`avro_can_read`, the rules of the Avro 1.11 specification described there). Each pair of
types compared pays a step from the budget in force (`danube.machines.schema.budget`)."""

from __future__ import annotations

from collections.abc import Mapping

from danube.machines.schema import budget as budgets
from danube.machines.schema.avro_model import (
    _PROMOTIONS,
    AvroSchema,
    _Array,
    _deref,
    _describe,
    _Enum,
    _Fixed,
    _Map,
    _Named,
    _Node,
    _Record,
    _short,
    _Union,
)
from danube.machines.schema.compatibility import Incompatibility
from danube.machines.schema.limits import COMPATIBILITY_STEPS, SCHEMA_CPU_SECONDS


def avro_can_read(reader: AvroSchema, writer: AvroSchema) -> list[Incompatibility]:
    """Every reason a consumer holding `reader` could fail to read data written with `writer`,
    by the specification's Schema Resolution rules; empty when it always can.

    Where the specification leaves room: named types match on their unqualified names (its
    words) or when the writer's full name is one of the reader's aliases (qualified in the
    reader's namespace, as Java does); a writer type read by a reader union is readable when
    any branch reads it (Java's SchemaCompatibility, which registries follow), and if none
    does the findings of the first branch the specification would pick are reported.
    Logical types are ignored, as resolution ignores them."""
    budget = budgets.current() or budgets.runtime().budget(
        COMPATIBILITY_STEPS, "compatibility check", "compatibility steps", SCHEMA_CPU_SECONDS
    )
    resolution = _Resolution(reader._named, writer._named, budget)
    try:
        return list(resolution.compare(reader._tree, writer._tree))
    except RecursionError:
        return [Incompatibility("", "the schemas are nested too deeply to compare")]


def _under(prefix: str, found: list[Incompatibility]) -> list[Incompatibility]:
    return [Incompatibility(prefix + issue.path, issue.message) for issue in found]


def _names_match(reader: _Named, writer: _Named) -> bool:
    return _short(reader.name) == _short(writer.name) or writer.name in reader.aliases


class _Resolution:
    """One reader/writer comparison; findings carry paths relative to the types compared, and
    each caller puts its own step in front. Record pairs are memoised: a pair met again while
    still being compared is taken as readable — recursive types describe finite data, so a
    real mismatch shows at the outer level — and a finished pair's findings are reused
    wherever the pair occurs again, which keeps schemas that share types linear."""

    def __init__(
        self, reader: Mapping[str, _Named], writer: Mapping[str, _Named], budget: budgets.Budget
    ) -> None:
        self._budget = budget
        self._reader = reader
        self._writer = writer
        self._records: dict[tuple[str, str], list[Incompatibility] | None] = {}

    def compare(self, reader: _Node, writer: _Node) -> list[Incompatibility]:
        self._budget.spend()
        r = _deref(reader, self._reader)
        w = _deref(writer, self._writer)
        if isinstance(w, _Union):
            return [
                issue
                for index, branch in enumerate(w.branches)
                for issue in _under(f"/union[{index}]", self.compare(r, branch))
            ]
        if isinstance(r, _Union):
            return self._reader_union(r, w)
        if isinstance(r, str) and isinstance(w, str):
            if r == w or (w, r) in _PROMOTIONS:
                return []
        elif isinstance(r, _Array) and isinstance(w, _Array):
            return _under("/items", self.compare(r.items, w.items))
        elif isinstance(r, _Map) and isinstance(w, _Map):
            return _under("/values", self.compare(r.values, w.values))
        elif isinstance(r, _Record) and isinstance(w, _Record):
            return self._record(r, w)
        elif isinstance(r, _Enum) and isinstance(w, _Enum):
            return self._enum(r, w)
        elif isinstance(r, _Fixed) and isinstance(w, _Fixed):
            return self._fixed(r, w)
        return [self._mismatch(r, w)]

    def _mismatch(self, reader: _Node, writer: _Node) -> Incompatibility:
        return Incompatibility(
            "",
            f"writer type {_describe(writer, self._writer)} cannot be read as "
            f"{_describe(reader, self._reader)}",
        )

    def _reader_union(self, reader: _Union, writer: _Node) -> list[Incompatibility]:
        first_match: list[Incompatibility] | None = None
        for branch in reader.branches:
            found = self.compare(branch, writer)
            if not found:
                return []
            if first_match is None and self._matches(_deref(branch, self._reader), writer):
                first_match = found
        if first_match is not None:
            return first_match
        return [
            Incompatibility(
                "",
                f"writer type {_describe(writer, self._writer)} cannot be read by any branch of "
                f"the reader's {_describe(reader, self._reader)}",
            )
        ]

    @staticmethod
    def _matches(reader: _Node, writer: _Node) -> bool:
        """The specification's shallow "match", which picks the reader branch whose deeper
        findings are worth reporting."""
        if isinstance(reader, str) or isinstance(writer, str):
            return reader == writer or (writer, reader) in _PROMOTIONS
        if type(reader) is not type(writer):
            return False
        if isinstance(reader, _Record | _Enum | _Fixed) and isinstance(
            writer, _Record | _Enum | _Fixed
        ):
            return _names_match(reader, writer)
        return isinstance(reader, _Array | _Map)

    def _renamed(self, kind: str, reader: _Named, writer: _Named) -> list[Incompatibility]:
        return [
            Incompatibility(
                "",
                f"writer {kind} '{writer.name}' cannot be read as {kind} '{reader.name}': the "
                f"names differ and '{writer.name}' is not an alias of the reader's",
            )
        ]

    def _record(self, reader: _Record, writer: _Record) -> list[Incompatibility]:
        if not _names_match(reader, writer):
            return self._renamed("record", reader, writer)
        key = (reader.name, writer.name)
        if key in self._records:
            return self._records[key] or []
        self._records[key] = None
        written = {f.name: f for f in writer.fields}
        found: list[Incompatibility] = []
        for wanted in reader.fields:
            source = next(
                (written[name] for name in (wanted.name, *wanted.aliases) if name in written),
                None,
            )
            where = f"/fields/{wanted.name}"
            if source is not None:
                found.extend(_under(where, self.compare(wanted.type, source.type)))
            elif not wanted.has_default:
                found.append(
                    Incompatibility(
                        where,
                        f"reader field '{wanted.name}' has no default and the writer has no "
                        "such field",
                    )
                )
        self._records[key] = found
        return found

    def _enum(self, reader: _Enum, writer: _Enum) -> list[Incompatibility]:
        if not _names_match(reader, writer):
            return self._renamed("enum", reader, writer)
        missing = [symbol for symbol in writer.symbols if symbol not in reader.symbols]
        if not missing or reader.default is not None:
            return []
        listed = ", ".join(f"'{symbol}'" for symbol in missing)
        return [
            Incompatibility(
                "",
                f"writer symbols {listed} of enum '{writer.name}' are not in the reader's "
                "symbols, and the reader's enum has no default",
            )
        ]

    def _fixed(self, reader: _Fixed, writer: _Fixed) -> list[Incompatibility]:
        if not _names_match(reader, writer):
            return self._renamed("fixed", reader, writer)
        if reader.size == writer.size:
            return []
        return [
            Incompatibility(
                "",
                f"writer fixed '{writer.name}' has size {writer.size}, the reader's has size "
                f"{reader.size}",
            )
        ]

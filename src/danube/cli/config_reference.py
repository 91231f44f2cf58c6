"""The configuration reference (spec/configuration.md), generated from the broker's own
definitions so it cannot drift from them: every `danube-broker` flag with its environment
variable, default and meaning (from the parser), and every key the configuration file takes,
section by section (recorded from the loader's own checks while it reads a file that has
every section), with the defaults of the sections that are plain records.

    python -m danube.cli.config_reference > spec/configuration.md

`nox -s generate` writes it; `tests/core/test_config_reference.py` fails when it is stale."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import sys
from collections.abc import Iterator
from typing import Any
from unittest import mock

from danube.cli.broker import build_parser
from danube.cli.environment import settings, variable
from danube.values import config as config_module
from danube.values import load_manager_config

EVERY_SECTION: dict[str, Any] = {
    "broker": {"ports": {}, "grpc": {}, "advertised_listeners": {}},
    "meta_store": {},
    "metrics": {},
    "bootstrap_namespaces": ["default"],
    "auto_create_topics": True,
    "policies": {},
    "dispatch": {},
    "storage": {"durable": {}, "wal": {"file_sync": {}, "rotation": {}}, "local_retention": {}},
    "cluster": {"replication": {}},
    "load_manager": {"rebalancing": {}},
}
"""A file with every section the loader knows, each empty, so each section's check runs."""


def file_sections() -> dict[str, tuple[list[str], dict[str, Any]]]:
    """Section -> (the keys it accepts, defaults of those that are plain record fields),
    as the loader checks them."""
    found: dict[str, tuple[list[str], dict[str, Any]]] = {}
    keys, fill = config_module._keys, config_module._fill
    reject = load_manager_config._reject_unknown

    def record_keys(data: dict[str, Any], allowed: set[str], where: str) -> None:
        found.setdefault(where, (sorted(allowed), {}))
        keys(data, allowed, where)

    def record_fill(cls: type, data: dict[str, Any], where: str) -> Any:
        blank = cls()
        defaults = {f.name: getattr(blank, f.name) for f in dataclasses.fields(cls)}
        found[where] = (sorted(defaults), defaults)
        return fill(cls, data, where)

    def record_reject(data: Any, allowed: set[str], where: str) -> None:
        found.setdefault(where, (sorted(allowed), {}))
        reject(data, allowed, where)

    with (
        mock.patch.object(config_module, "_keys", record_keys),
        mock.patch.object(config_module, "_fill", record_fill),
        mock.patch.object(load_manager_config, "_reject_unknown", record_reject),
    ):
        config_module.config_from_mapping(EVERY_SECTION)
    found["(top level)"] = (sorted(config_module._TOP_LEVEL), {})
    return dict(sorted(found.items()))


def key_defaults(sections: dict[str, tuple[list[str], dict[str, Any]]]) -> dict[str, Any]:
    """`section.key` -> the default the loader leaves when the key is absent, found in the
    configuration it builds from a file with every section empty: the key's own field in the
    record its section fills (`storage.wal` -> `storage.wal.*`), or the field it is stored
    under (`storage.durable.root` -> `durable_root`, `cluster.replication.lag_ms` ->
    `replication_lag_ms`, `meta_store.prefix` -> `etcd_prefix`). Keys kept in no plain field
    (addresses, ports, advertised listeners) show none: their flags say them."""
    built = config_module.config_from_mapping(EVERY_SECTION)
    found: dict[str, Any] = {}
    for section, (keys, _) in sections.items():
        parts = [] if section.startswith("(") else section.split(".")
        manager = built.cluster.load_manager
        candidates: list[Any] = [built, built.cluster, built.grpc]
        if parts[:1] == ["load_manager"]:
            candidates.insert(0, manager.rebalancing if parts[1:] else manager)
        node: Any = built
        for part in parts:
            node = getattr(node, part, None)
            if node is None:
                break
            candidates.insert(0, node)
        last = parts[-1] if parts else ""
        for key in keys:
            for holder in candidates:
                if not dataclasses.is_dataclass(holder):
                    continue
                names = {f.name for f in dataclasses.fields(holder)}
                name = next((n for n in (key, f"{last}_{key}", f"etcd_{key}") if n in names), None)
                if name is not None:
                    value = getattr(holder, name)
                    if not dataclasses.is_dataclass(value):
                        found[f"{section}.{key}"] = value
                    break
    return found


def _default(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "off"
    if action.default is None or action.default is argparse.SUPPRESS:
        return "—"
    return f"`{action.default}`"


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def lines() -> Iterator[str]:
    parser = build_parser()
    yield "# Configuration reference"
    yield ""
    yield "<!-- Generated by `python -m danube.cli.config_reference` (nox -s generate); do not"
    yield "edit: tests/core/test_config_reference.py fails when it is stale. -->"
    yield ""
    yield "A broker takes its settings from, in order of precedence: a flag on the command line,"
    yield "the flag's environment variable, the configuration file (`--config-file`, Danube's"
    yield "key layout), and the defaults. A bad value from the environment is a usage error"
    yield "naming the variable (exit 2); a bad file is a configuration error (exit 2)."
    yield ""
    yield "## Flags and environment variables"
    yield ""
    yield "| flag | environment | default | meaning |"
    yield "|---|---|---|---|"
    for action in settings(parser):
        flag = ", ".join(f"`{option}`" for option in action.option_strings)
        meaning = _cell(action.help)
        if action.choices is not None:
            meaning += f" (one of {', '.join(map(str, action.choices))})"
        yield f"| {flag} | `{variable(action)}` | {_default(action)} | {meaning} |"
    yield ""
    yield "Not settings, so no variable: `--config-file`, `--warm-kernels`, `--version`,"
    yield "`--completion`, `--help`."
    yield ""
    yield "## Keys of the configuration file"
    yield ""
    yield "Each section and the keys the loader accepts there (any other key is refused with"
    yield "its name), with the default the loader leaves when a key is absent (none shown: an"
    yield "address or port whose flag above gives it, or a sub-section). What each key"
    yield "means is in the flag above that names it (`storage.mode`, `broker.memory_budget`,"
    yield "...) and in spec/: `durability.md` (storage), `cluster.md` (cluster, load_manager,"
    yield "meta_store), `replication.md` (cluster.replication), `memory.md`, `observability.md`"
    yield "(metrics); policies and dispatch: `admin-cli.md` (`set-policies`)."
    yield ""
    yield "| section | keys |"
    yield "|---|---|"
    sections = file_sections()
    defaults_of = key_defaults(sections)
    for section, (keys, defaults) in sections.items():
        shown = []
        for key in keys:
            value = defaults.get(key, defaults_of.get(f"{section}.{key}", _NONE))
            shown.append(f"`{key}`" if value is _NONE else f"`{key}` ({_shown(value)})")
        yield f"| `{section}` | {', '.join(shown)} |"


_NONE = object()


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if value == "":
        return '""'
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    return _cell(str(value))


def render() -> str:
    return "\n".join(lines()) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())

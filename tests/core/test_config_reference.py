"""spec/configuration.md is what `python -m danube.cli.config_reference` makes now (issue 26,
point 7: a reference generated from the configuration model), and it names every flag, its
environment variable and every section of the file."""

from __future__ import annotations

from pathlib import Path

from danube.cli.broker import build_parser
from danube.cli.config_reference import file_sections, render
from danube.cli.environment import settings, variable

REFERENCE = Path(__file__).resolve().parents[2] / "spec" / "configuration.md"


def test_the_reference_is_current() -> None:
    assert REFERENCE.read_text() == render(), "run `nox -s config_reference`"


def test_it_names_every_flag_variable_and_section() -> None:
    text = REFERENCE.read_text()
    for action in settings(build_parser()):
        assert f"`{action.option_strings[-1]}`" in text
        assert f"`{variable(action)}`" in text
    sections = file_sections()
    assert {"broker", "storage.durable", "cluster.replication", "load_manager"} <= set(sections)
    assert "memory_budget" in sections["broker"][0]


def test_file_keys_show_the_loaders_defaults() -> None:
    text = REFERENCE.read_text()
    for shown in (
        "`lease_ttl_ms` (10000)",
        "`durability` (fsync)",
        "`publish_wait_ms` (3000)",
        "`max_moves_per_hour` (10)",
        "`cluster_name` (STANDALONE)",
    ):
        assert shown in text, shown

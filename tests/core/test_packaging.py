"""The install metadata (issue 26): ranged dependencies for applications, exact pins in
constraints.txt for CI, a base install that is the client alone, py.typed and LICENSE."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXACT_ALLOWED = {"betterproto", "ruff"}
"""Kept exact in the metadata on purpose: betterproto (the generated code in src/danube/proto
is this beta's), ruff (a formatter's output changes with its version; dev only)."""
BROKER_MODULES = (
    "numba", "llvmlite", "numpy", "trio", "trio_asyncio", "yaml", "fsspec", "s3fs",
    "grpc_tools", "prometheus_client",
)  # fmt: skip
"""Top-level modules of the `broker` extra: the client and its tools must import none."""


def requirements() -> list[Requirement]:
    found = [Requirement(text) for text in PROJECT["dependencies"]]
    for extra in PROJECT["optional-dependencies"].values():
        found += [Requirement(text) for text in extra]
    return found


def pins() -> dict[str, str]:
    pinned = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pinned[canonicalize_name(name)] = version
    return pinned


def test_dependencies_are_ranges_not_pins() -> None:
    """Exact `==` pins in the metadata conflict with an application's own pins."""
    for requirement in requirements():
        if canonicalize_name(requirement.name) in EXACT_ALLOWED:
            continue
        operators = {spec.operator for spec in requirement.specifier}
        assert "==" not in operators, f"{requirement} pins exactly: give a range"
        assert ">=" in operators, f"{requirement} has no lower bound"


def test_every_dependency_is_pinned_in_the_constraints_and_the_pin_is_in_range() -> None:
    pinned = pins()
    for requirement in requirements():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement.name} has no pin in constraints.txt"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"constraints.txt pins {requirement.name}=={pinned[name]}, outside {requirement}"
        )


def test_the_base_install_is_the_client() -> None:
    def names(texts: list[str]) -> set[str]:
        return {canonicalize_name(Requirement(text).name) for text in texts}

    base = names(PROJECT["dependencies"])
    broker = names(PROJECT["optional-dependencies"]["broker"])
    assert {"numba", "numpy", "trio", "grpcio-tools", "s3fs"} <= broker
    assert not base & {"numba", "llvmlite", "numpy", "trio", "grpcio-tools", "s3fs", "fsspec"}
    assert "crc32c" in base


def test_the_client_and_its_tools_import_nothing_of_the_broker_extra() -> None:
    """In a fresh interpreter whose broker-extra modules cannot be imported, as after
    `pip install pydanube`: the client, its names and every tool's parser work, and
    danube-broker and danube-local-cluster say which extra is missing, not a traceback."""
    code = f"""
import importlib.abc, io, json, sys, contextlib
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BROKER_MODULES!r}:
            raise ImportError(f"No module named {{name!r}}")
sys.meta_path.insert(0, Missing())
import danube.client as client
for name in client.__all__: getattr(client, name)
from danube.cli import admin, client as cli, broker, local_cluster
admin.build_parser(); cli.build_parser(); broker.build_parser(); local_cluster.build_parser()
answers = []
for tool, argv in ((broker, ["--prom-exporter", "off"]), (local_cluster, ["--brokers", "1"])):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        answers.append([tool.main(argv), err.getvalue()])
print(json.dumps(answers))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for status, err in json.loads(done.stdout):
        assert status == 1 and "pip install 'pydanube[broker]'" in err, err


def test_every_place_that_installs_the_broker_asks_for_its_extra() -> None:
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text()
    assert re.search(r'-c constraints\.txt -e "\.\[broker,[^"]*\]"', bootstrap), bootstrap
    assert "constraints.txt" in bootstrap.split("project_stamp=", 1)[1].splitlines()[0]
    assert "pydanube[broker]" in (ROOT / "README.md").read_text()


def test_the_package_ships_its_annotations_and_license() -> None:
    assert (ROOT / "src" / "danube" / "py.typed").exists()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in package_data["package-data"]["danube"]
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert PROJECT["license"] == "Apache-2.0"

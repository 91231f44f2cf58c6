"""The deployment kit (deploy/, issue 26 point 7) is checked without Docker, which cannot run
here: every file parses, every broker command in it is accepted by `danube-broker`'s own
parser and configuration, and every series the dashboard and the alerts query is one the
broker exports."""

from __future__ import annotations

import configparser
import json
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from danube.cli.broker import build_parser, load_config
from danube.runtime.metrics import BrokerMetrics
from danube.values.config import BrokerConfig, config_from_mapping
from tests.broker.test_metrics_http import standalone_core

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RUNTIME = DEPLOY.parent / "src" / "danube" / "runtime"
SUFFIXES = ("_bucket", "_sum", "_count")


def broker_config(argv: list[str]) -> BrokerConfig:
    """What `danube-broker argv` would run with (its parser and config checks)."""
    return load_config(build_parser().parse_args(argv))


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_the_compose_brokers_are_accepted_by_danube_broker() -> None:
    services = compose()["services"]
    brokers = {name: s for name, s in services.items() if name.startswith("broker")}
    assert len(brokers) == 3
    addresses = set()
    for name, service in brokers.items():
        config = broker_config(service["command"])
        assert config.mode == "cluster" and config.storage.mode == "object_store"
        assert config.cluster.etcd_endpoints == ("etcd:2379",)
        assert config.advertised_addr == f"{name}:6650"
        addresses.add(config.advertised_admin_addr)
        assert service["depends_on"]["etcd"]["condition"] == "service_started"
    assert addresses == {f"broker{i}:50051" for i in (1, 2, 3)}
    for needed in ("etcd", "minio", "bucket", "prometheus", "grafana"):
        assert needed in services


def test_the_image_runs_a_broker_the_parser_accepts() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    build, run = text.split("\nFROM python:3.11-slim-bookworm\n")
    # The kernels ahead of time, in a stage with a compiler (review finding: the image ran
    # the JIT kernels, 235 MiB of RSS against 87), and only the venv copied out of it.
    assert "FROM python:3.11-slim-bookworm AS build" in build and "gcc" in build
    assert "python -m danube.cli.build_kernels" in build
    assert "COPY --from=build /opt/danube/venv /opt/danube/venv" in run and "gcc" not in run
    assert "danube-broker --warm-kernels" in run, "the JIT fallback's cache is warmed too"
    assert re.search(r'^ENTRYPOINT \["danube-broker"\]', text, re.M)
    cmd = re.search(r"^CMD (\[.*?\])", text.replace("\\\n", ""), re.M | re.S)
    assert cmd is not None
    config = broker_config(json.loads(cmd.group(1)))
    assert str(config.broker_addr) == "0.0.0.0:6650"
    assert str(config.admin_addr) == "0.0.0.0:50051"


def test_the_systemd_unit_runs_a_broker_the_parser_accepts() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / "danube-broker.service")
    service = unit["Service"]
    assert service["User"] == "danube" and service["Restart"] == "on-failure"
    start = shlex.split(service["ExecStart"].replace("$DANUBE_BROKER_ARGS", "--mode cluster"))
    assert start[0].endswith("/danube-broker")
    args = build_parser().parse_args(start[1:])
    assert str(args.config_file) == "/etc/danube/broker.yml" and args.mode == "cluster"
    pre = [
        line.split("=", 1)[1]
        for line in (DEPLOY / "systemd" / "danube-broker.service").read_text().splitlines()
        if line.startswith("ExecStartPre=")
    ]
    # The kernels built ahead of time first (as root, a failure tolerated), then warmed.
    assert shlex.split(pre[0]) == [
        "-+/opt/danube/venv/bin/python",
        "-m",
        "danube.cli.build_kernels",
    ]
    assert shlex.split(pre[1])[1:] == ["--warm-kernels"]


def test_the_example_configuration_loads() -> None:
    config = config_from_mapping(yaml.safe_load((DEPLOY / "broker.yml").read_text()))
    assert config.storage.mode == "object_store" and config.memory_budget == 4 * 2**30
    assert len(config.cluster.etcd_endpoints) == 3


def queried_series() -> set[str]:
    """Every series name the dashboard and the alert rules query."""
    exprs = [
        target["expr"]
        for panel in json.loads((DEPLOY / "grafana/dashboards/danube.json").read_text())["panels"]
        for target in panel["targets"]
    ]
    rules = yaml.safe_load((DEPLOY / "prometheus/alerts.yml").read_text())
    exprs += [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    found = set()
    for expr in exprs:
        found |= set(re.findall(r"\b((?:danube|process|python)_[a-z_]+)", expr))
    return found


def declared_danube_series() -> set[str]:
    names = set()
    for module in RUNTIME.glob("*.py"):
        names |= set(re.findall(r'"(danube_[a-z_]+)"', module.read_text()))
    return names


def test_every_queried_series_is_exported() -> None:
    series = queried_series()
    assert len(series) > 20
    declared = declared_danube_series()
    process = BrokerMetrics(standalone_core(), "1", "standalone").exposition().decode()
    for name in sorted(series):
        base = next((name[: -len(s)] for s in SUFFIXES if name.endswith(s)), name)
        if name.startswith("danube_"):
            assert base in declared, f"{name} is no series the broker exports"
        else:
            assert f"\n{base}" in process, f"{name} is no process series the broker exports"


def test_prometheus_scrapes_the_brokers_and_loads_the_rules() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "danube"  # the alerts' up{job="danube"}
    assert job["static_configs"][0]["targets"] == [f"broker{i}:9040" for i in (1, 2, 3)]
    rules = yaml.safe_load((DEPLOY / "prometheus/alerts.yml").read_text())
    names = [rule["alert"] for group in rules["groups"] for rule in group["rules"]]
    assert len(names) == len(set(names)) >= 10

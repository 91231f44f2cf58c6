"""Session-wide fixtures: one shared broker process for tests that only need a broker, one
shared etcd for every test that needs one (started on first use), and one Spark session for
every audit."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from danube.localcluster.broker_process import BrokerProcess
from danube.localcluster.etcd_process import EtcdProcess
from tests.support.etcd import EtcdStores


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A standalone broker shared by the whole session; tests use unique topic names."""
    with BrokerProcess(tmp_path_factory.mktemp("shared-broker")) as process:
        yield process


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[type[BrokerProcess]]:
    """For tests that restart, kill or configure their own broker; all are killed at the end."""
    started: list[BrokerProcess] = []

    class Factory(BrokerProcess):
        def start(self) -> BrokerProcess:
            started.append(self)
            return super().start()

    yield Factory
    for process in started:
        process.kill()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """One etcd for the whole run, started when a test first needs it; tests keep out of each
    other's way through key prefixes (`EtcdStores`)."""
    with EtcdProcess(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture
async def etcd_stores(etcd_server: EtcdProcess) -> AsyncIterator[EtcdStores]:
    stores = EtcdStores(etcd_server)
    try:
        yield stores
    finally:
        await stores.close()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session for every audit (tests/spark and the real-process runs of
    tests/broker): starting one costs about ten seconds and a gigabyte (environment-notes).
    pyspark is imported here, not at the top: most tests never need it."""
    from spark.session import get_session

    session = get_session("local[2]", app="danube-audit-tests", progress=False)
    yield session
    session.stop()

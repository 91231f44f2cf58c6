"""One local Spark session for every audit test (starting one costs about ten seconds and a
gigabyte, environment-notes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark.session import get_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = get_session("local[2]", app="danube-audit-tests", progress=False)
    yield session
    session.stop()

"""A Spark session for the audits: local mode on this machine, or whatever `spark-submit`
set up on a cluster."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

DEBIAN_JAVA = Path("/usr/lib/jvm/java-17-openjdk-amd64")


def local_environment() -> None:
    """What local mode needs here (environment-notes: without SPARK_LOCAL_IP Spark binds a
    non-loopback address; workers must run this interpreter)."""
    if "JAVA_HOME" not in os.environ and DEBIAN_JAVA.exists():
        os.environ["JAVA_HOME"] = str(DEBIAN_JAVA)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def get_session(
    master: str | None, app: str = "danube-audit", progress: bool = True
) -> SparkSession:
    """`master` None keeps the one `spark-submit` chose (or an active session); `local[N]`
    starts local mode on loopback."""
    builder = SparkSession.builder.appName(app)
    if master is not None:
        local_environment()
        builder = (
            builder.master(master)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "8")
            .config("spark.driver.memory", os.environ.get("DANUBE_AUDIT_DRIVER_MEMORY", "2g"))
        )
    builder = builder.config("spark.ui.showConsoleProgress", str(progress).lower())
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session

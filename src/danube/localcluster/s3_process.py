"""moto's S3-compatible server as a subprocess on a loopback port, with one bucket.

Credentials are moto's test ones, passed to brokers in their environment (as a deployment
passes real ones), never in a config file.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from danube.localcluster.etcd_process import free_port, terminate

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class S3Process:
    def __init__(self, log_path: Path, bucket: str = "danube") -> None:
        self.log_path = log_path
        self.bucket = bucket
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Process:
        self.port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # outlives a Ctrl-C until the brokers have stopped
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the S3 server exited; see {self.log_path}")
            try:
                request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
                with urllib.request.urlopen(request, timeout=1) as response:
                    response.read()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"the S3 server did not answer within {START_TIMEOUT_S} s"
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process, STOP_TIMEOUT_S)
        self.process = None

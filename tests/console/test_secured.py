"""The console in front of a secured broker (issue 25's TLS and tokens; spec/security.md):
it calls the admin port with the TLS settings and token it was given, as `danube-admin`
does, so the broker enforces that principal's permissions and the page shows the refusal."""

from __future__ import annotations

import json

import pytest

from danube.localcluster.broker_process import BrokerProcess
from tests.broker.test_security import (  # noqa: F401 (pki, secured: fixtures)
    Pki,
    fresh,
    pki,
    produce,
    secured,
    security,
)
from tests.console.support import ConsoleServer, call, request
from tests.support.aio import run as aio_run

pytestmark = pytest.mark.slow


def test_the_console_acts_as_the_principal_it_was_given(secured: BrokerProcess, pki: Pki) -> None:  # noqa: F811
    endpoint = f"https://{secured.admin_addr}"
    topic = fresh()
    aio_run(lambda: produce(secured, security(pki, "app"), topic))
    with ConsoleServer(endpoint, security=security(pki, "root")) as console:
        status, body = call(console.url, "list_namespaces")
        assert status == 200 and "default" in body["data"]["namespaces"], body
        # the charts read the HTTPS metrics port with the same CA
        status, _, raw = request(f"{console.url}/api/topic-series?topic={topic}")
        assert status == 200 and json.loads(raw)["data"]["messages_in"] == 1.0, raw
    with ConsoleServer(endpoint, security=security(pki, "app")) as console:
        status, body = call(console.url, "create_namespace", {"namespace": "not-for-app"})
        assert status == 409 and "PERMISSION_DENIED" in body["error"], body
    with ConsoleServer(endpoint, security=security(pki)) as console:  # TLS, no token
        status, body = call(console.url, "list_namespaces")
        assert status == 409 and "UNAUTHENTICATED" in body["error"], body
        assert "\n" not in body["error"]

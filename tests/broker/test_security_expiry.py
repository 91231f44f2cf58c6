"""A stream outlives its token no more than the leeway (spec/security.md, "A call lives no
longer than its token"), in a real broker: a consumer's ReceiveMessages stream, opened with a
token that expires two seconds later (leeway 0), is ended UNAUTHENTICATED then, while a
stream of a token that lasts keeps going."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpclib.client
import pytest
import yaml
from grpclib import GRPCError

from danube.localcluster.broker_process import BrokerProcess
from danube.proto import danube as pb
from danube.runtime.tls import client_context
from tests.broker.test_security import SECRET, Pki, mint
from tests.broker.test_security import pki as pki  # the certificates, as a fixture here

pytestmark = pytest.mark.slow
TTL_S = 2


async def _receive_until_ended(address: str, ca_file: Path, token: str, wait_s: float) -> str:
    """Subscribes, opens ReceiveMessages and waits up to `wait_s`: the status the stream
    ended with, or "OPEN"."""
    host, port = address.rsplit(":", 1)
    channel = grpclib.client.Channel(host, int(port), ssl=client_context(str(ca_file)))
    headers = {"authorization": f"Bearer {token}"}
    try:
        await pb.ProducerServiceStub(channel).create_producer(  # the topic exists
            pb.ProducerRequest(request_id=1, producer_name="p", topic_name="/default/expiry"),
            metadata=headers,
        )
        stub = pb.ConsumerServiceStub(channel)
        subscribed = await stub.subscribe(
            pb.ConsumerRequest(
                request_id=1, topic_name="/default/expiry", consumer_name="c",
                subscription=f"s-{time.monotonic_ns()}",
            ),
            metadata=headers,
        )  # fmt: skip
        request = pb.ReceiveRequest(request_id=2, consumer_id=subscribed.consumer_id)
        try:
            async with asyncio.timeout(wait_s):
                async for _ in stub.receive_messages(request, metadata=headers):
                    pass
        except TimeoutError:
            return "OPEN"
        except GRPCError as error:
            return f"{error.status.name} {error.message}"
        return "ENDED"
    finally:
        channel.close()


def test_a_stream_is_ended_when_its_token_expires(
    pki: Pki, broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    config = tmp_path / "broker.yaml"
    auth = {
        "mode": "tls",
        "tls": {"cert_file": str(pki.dir / "cert.pem"), "key_file": str(pki.dir / "key.pem")},
        "jwt": {"leeway_seconds": 0},
        "super_admins": ["root"],
    }
    config.write_text(yaml.safe_dump({"auth": auth}))
    with broker_factory(
        tmp_path / "data", config_file=config, env={"DANUBE_JWT_SECRET_KEY": SECRET}
    ) as broker:
        short = mint("root", SECRET, now=time.time(), ttl_s=TTL_S)
        started = time.monotonic()
        ended = asyncio.run(_receive_until_ended(broker.broker_addr, pki.ca_file, short, 15))
        took = time.monotonic() - started
        assert ended.startswith("UNAUTHENTICATED") and "expired" in ended, ended
        assert took < TTL_S + 3, took
        lasting = mint("root", SECRET, now=time.time(), ttl_s=3600)
        ended = asyncio.run(_receive_until_ended(broker.broker_addr, pki.ca_file, lasting, 4))
        assert ended == "OPEN", ended
        assert "authn_failures" not in broker.log_text()

"""A secured standalone broker (issue 25, part 1; spec/security.md), a real process with
`trustme` certificates: TLS on the client, admin and metrics ports, plaintext refused, bearer
tokens and client certificates as identities, RBAC from the configuration, certificate
rotation without restart, danube-admin and danube-cli over TLS, and no secret in the log."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
import yaml

from danube.client import ClientSecurity, DanubeClient, DanubeClientError
from danube.client.connection import RetryPolicy
from danube.localcluster.broker_process import BrokerProcess
from danube.machines.security.tokens import mint
from tests.support.aio import receive_n
from tests.support.aio import run as aio_run

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
SECRET = "secret-for-tests-" + os.urandom(8).hex()
NO_RETRY = RetryPolicy(max_retries=0, min_elapsed_s=0)


def fresh(namespace: str = "default") -> str:
    return f"/{namespace}/sec-{uuid.uuid4().hex[:10]}"


@dataclass
class Pki:
    dir: Path
    ca: trustme.CA
    ca_file: Path
    client_pem: Path
    """A client certificate (CN=app) with its key, from the same CA."""

    def server_files(self, ca: trustme.CA, cert: Path, key: Path) -> None:
        issued = ca.issue_cert("127.0.0.1", "localhost")
        issued.private_key_pem.write_to_path(str(key))
        issued.cert_chain_pems[0].write_to_path(str(cert))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    client = ca.issue_cert("app@example.test", common_name="app")
    client.private_key_and_cert_chain_pem.write_to_path(str(root / "client.pem"))
    pki = Pki(root, ca, root / "ca.pem", root / "client.pem")
    pki.server_files(ca, root / "cert.pem", root / "key.pem")
    return pki


def config(pki: Pki, path: Path, *, verify_client: bool = False) -> Path:
    data = {
        "bootstrap_namespaces": ["default", "other"],
        "auth": {
            "mode": "tls",
            "tls": {
                "cert_file": str(pki.dir / "cert.pem"),
                "key_file": str(pki.dir / "key.pem"),
                "ca_file": str(pki.ca_file),
                "verify_client": verify_client,
            },
            "jwt": {"issuer": "danube-auth"},  # the secret comes from the environment
            "super_admins": ["root"],
            "roles": [
                {"name": "producer", "permissions": ["Produce", "Lookup"]},
                {"name": "consumer", "permissions": ["Consume", "Lookup"]},
            ],
            "bindings": [
                {
                    "id": "app",
                    "principal_type": "service_account",
                    "principal_name": "app",
                    "roles": ["producer", "consumer"],
                    "scope": "namespace",
                    "resource_name": "/default",
                },
                {
                    "id": "reader",
                    "principal_type": "user",
                    "principal_name": "reader",
                    "roles": ["consumer"],
                    "scope": "namespace",
                    "resource_name": "default",
                },
            ],
        },
    }
    path.write_text(yaml.safe_dump(data))
    return path


def _secured(pki: Pki, tmp: Path, **options: bool) -> BrokerProcess:
    return BrokerProcess(
        tmp / "data",
        config_file=config(pki, tmp / "broker.yaml", **options),
        env={"DANUBE_JWT_SECRET_KEY": SECRET},
    )


@pytest.fixture(scope="module")
def secured(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with _secured(pki, tmp_path_factory.mktemp("secured")) as process:
        yield process


def token(name: str, kind: str = "service_account", **options: object) -> str:
    return mint(name, SECRET, now=time.time(), principal_type=kind, **options)  # type: ignore[arg-type]


def security(pki: Pki, name: str | None = None, **options: object) -> ClientSecurity:
    return ClientSecurity(
        ca_file=str(pki.ca_file),
        token=token(name) if name else None,
        **options,  # type: ignore[arg-type]
    )


async def produce(broker: BrokerProcess, sec: ClientSecurity | None, topic: str) -> None:
    url = f"https://{broker.broker_addr}"
    async with DanubeClient(url, security=sec, retry=NO_RETRY) as client:
        producer = client.producer(topic, "p", batching=None)
        await producer.create()
        await producer.send(b"hello")


def refusal(broker: BrokerProcess, sec: ClientSecurity | None, topic: str) -> str:
    with pytest.raises(DanubeClientError) as raised:
        aio_run(lambda: produce(broker, sec, topic))
    return str(raised.value)


def test_a_token_client_produces_and_consumes_over_tls(secured: BrokerProcess, pki: Pki) -> None:
    topic = fresh()

    async def scenario() -> bytes:
        url = f"https://{secured.broker_addr}"
        async with DanubeClient(url, security=security(pki, "app")) as client:
            producer = client.producer(topic, "p")
            await producer.create()
            consumer = client.consumer(topic, "c", "s")
            await consumer.subscribe()
            await producer.send(b"over tls")
            (message,) = await receive_n(consumer, 1)
            return message.payload

    assert aio_run(scenario) == b"over tls"


def test_plaintext_is_refused(secured: BrokerProcess) -> None:
    message = refusal(secured, None, fresh())
    assert "cannot reach" in message


def test_no_token_and_bad_tokens_are_unauthenticated(secured: BrokerProcess, pki: Pki) -> None:
    topic = fresh()
    assert "UNAUTHENTICATED" in refusal(secured, security(pki), topic)
    forged = mint("app", "not-the-secret-" + "x" * 32, now=time.time())
    expired = mint("app", SECRET, now=time.time() - 7200, ttl_s=60)
    other_issuer = mint("app", SECRET, now=time.time(), issuer="elsewhere")
    for bad in (forged, expired, other_issuer, "garbage"):
        message = refusal(secured, ClientSecurity(ca_file=str(pki.ca_file), token=bad), topic)
        assert "UNAUTHENTICATED" in message
        assert bad not in message


def test_rbac_default_deny_and_namespace_bindings(secured: BrokerProcess, pki: Pki) -> None:
    """`reader` may consume but not produce; `nobody` has no binding; `app`'s binding names
    the namespace with a leading slash (Danube would never match it); the root super admin
    may do anything; a client sending Danube's internal-broker header gains nothing."""
    topic = fresh()
    denied = refusal(
        secured, ClientSecurity(ca_file=str(pki.ca_file), token=token("reader", "user")), topic
    )
    assert "PERMISSION_DENIED" in denied and "Produce" in denied
    assert "PERMISSION_DENIED" in refusal(secured, security(pki, "nobody"), topic)
    aio_run(lambda: produce(secured, security(pki, "app"), topic))
    aio_run(lambda: produce(secured, security(pki, "root"), fresh("other")))
    assert "PERMISSION_DENIED" in refusal(secured, security(pki, "app"), fresh("other"))


def test_internal_broker_header_grants_nothing(secured: BrokerProcess, pki: Pki) -> None:
    from danube.client.connection import BrokerChannel
    from danube.proto import danube as pb

    async def scenario() -> None:
        host, port = secured.broker_addr.split(":")
        channel = BrokerChannel(host, int(port), security(pki, "nobody"))
        try:
            stub = pb.DiscoveryStub(channel, metadata={"x-danube-internal-broker": "broker/1"})
            await stub.topic_lookup(pb.TopicLookupRequest(request_id=1, topic="/default/x"))
        finally:
            channel.close()

    from grpclib import GRPCError
    from grpclib.const import Status

    with pytest.raises(GRPCError) as raised:
        aio_run(scenario)
    assert raised.value.status is Status.PERMISSION_DENIED


def test_a_client_certificate_is_an_identity(secured: BrokerProcess, pki: Pki) -> None:
    cert = ClientSecurity(ca_file=str(pki.ca_file), cert_file=str(pki.client_pem))
    aio_run(lambda: produce(secured, cert, fresh()))


def test_mutual_tls_without_a_client_certificate_is_refused(pki: Pki, tmp_path: Path) -> None:
    with _secured(pki, tmp_path, verify_client=True) as broker:
        message = refusal(broker, security(pki, "app"), fresh())
        assert "cannot reach" in message
        cert = ClientSecurity(ca_file=str(pki.ca_file), cert_file=str(pki.client_pem))
        aio_run(lambda: produce(broker, cert, fresh()))


def _served_issuer(address: str, ca_file: Path) -> str:
    host, port = address.split(":")
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        cert = tls.getpeercert()
    return str(cert["issuer"])


def test_a_rotated_certificate_is_served_without_restart(pki: Pki, tmp_path: Path) -> None:
    """The files change under the running broker: new connections get the new certificate
    (from another CA here, so the old CA no longer verifies), and clients keep working."""
    files = tmp_path / "pki"
    files.mkdir()
    for name in ("cert.pem", "key.pem", "ca.pem", "client.pem"):
        (files / name).write_bytes((pki.dir / name).read_bytes())
    moved = Pki(files, pki.ca, files / "ca.pem", files / "client.pem")
    with _secured(moved, tmp_path) as broker:
        before = _served_issuer(broker.broker_addr, moved.ca_file)
        new_ca = trustme.CA(organization_name="rotated")
        new_ca_file = tmp_path / "new-ca.pem"
        new_ca.cert_pem.write_to_path(str(new_ca_file))
        moved.server_files(new_ca, files / "cert.pem", files / "key.pem")
        broker.wait_for_log("event=tls_reloaded", timeout=10)
        after = _served_issuer(broker.broker_addr, new_ca_file)
        assert before != after and "rotated" in after
        with pytest.raises(ssl.SSLError):
            _served_issuer(broker.broker_addr, moved.ca_file)
        rotated = ClientSecurity(ca_file=str(new_ca_file), token=token("app"))
        aio_run(lambda: produce(broker, rotated, fresh()))


def test_a_revoked_binding_ends_an_open_receive_stream(secured: BrokerProcess, pki: Pki) -> None:
    """A receive stream reads its one request and then only sends, so it was decided once:
    root grants dave Consume on a topic, dave's stream delivers a message, root deletes the
    binding, and the stream ends PERMISSION_DENIED at its next delivery, without that
    message."""
    from grpclib import GRPCError
    from grpclib.const import Status

    from danube.client.connection import BrokerChannel
    from danube.proto import danube as pb
    from danube.proto import danube_admin as admin_pb

    topic = fresh()
    root, dave = security(pki, "root"), security(pki, "dave")

    def split(address: str) -> tuple[str, int]:
        host, _, port = address.rpartition(":")
        return host, int(port)

    async def scenario() -> tuple[bytes, Status, str]:
        admin = BrokerChannel(*split(secured.admin_addr), root)
        client = BrokerChannel(*split(secured.broker_addr), dave)
        url = f"https://{secured.broker_addr}"
        try:
            async with DanubeClient(url, security=root, retry=NO_RETRY) as publisher:
                producer = publisher.producer(topic, "root-p", batching=None)
                await producer.create()  # the topic exists from here on
                security_admin = admin_pb.SecurityAdminStub(admin)
                binding = admin_pb.BindingDefinition(
                    "dave-c", "service_account", "dave", ["consumer"], "topic", topic
                )
                await security_admin.create_binding(admin_pb.CreateBindingRequest(binding))
                consumers = pb.ConsumerServiceStub(client)
                subscribed = await consumers.subscribe(
                    pb.ConsumerRequest(1, topic, "dave", "dave-sub")
                )
                stream = consumers.receive_messages(
                    pb.ReceiveRequest(2, subscribed.consumer_id)
                ).__aiter__()
                await producer.send(b"one")
                first = await asyncio.wait_for(stream.__anext__(), 10)
                await security_admin.delete_binding(
                    admin_pb.DeleteBindingRequest("topic", topic, "dave-c")
                )
                await producer.send(b"two")
                try:
                    late = await asyncio.wait_for(stream.__anext__(), 10)
                except GRPCError as error:
                    return first.payload, error.status, str(error.message)
                raise AssertionError(f"delivered after the revocation: {late.payload!r}")
        finally:
            admin.close()
            client.close()

    first, status, reason = aio_run(scenario)
    assert first == b"one"
    assert status is Status.PERMISSION_DENIED and "Consume" in reason, reason


def test_metrics_over_tls_count_decisions(secured: BrokerProcess, pki: Pki) -> None:
    refusal(secured, security(pki, "nobody"), fresh())
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    url = f"https://{secured.metrics_addr}/metrics"

    def status(path: str = "/metrics", name: str | None = None) -> int:
        headers = {"Authorization": f"Bearer {token(name)}"} if name else {}
        request = urllib.request.Request(f"https://{secured.metrics_addr}{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as error:
            return error.code

    # a scrape needs Lookup on the cluster (spec/security.md, "Metrics"); probes stay open
    assert (status(), status(name="nobody"), status(name="root")) == (401, 403, 200)
    assert status("/healthz") == status("/readyz") == 200
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token('root')}"})
    text = urllib.request.urlopen(request, context=context, timeout=10).read().decode()
    assert "danube_authz_deny_total{broker=" in text
    assert 'permission="Lookup",resource="topic"' in text
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{secured.metrics_addr}/metrics", timeout=5).read()


def _tool(name: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / name), *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, **env}, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_tools_over_tls_with_danube_environment(secured: BrokerProcess, pki: Pki) -> None:
    minted = _tool(
        "danube-admin", "security", "tokens", "create", "--subject", "root",
        env={"DANUBE_JWT_SECRET_KEY": SECRET},
    )  # fmt: skip
    assert minted.returncode == 0, minted.stderr
    root = minted.stdout.strip()
    valid = _tool("danube-admin", "security", "tokens", "validate", "--token", root,
                  "--issuer", "danube-auth", env={"DANUBE_JWT_SECRET_KEY": SECRET})  # fmt: skip
    assert valid.returncode == 0 and "root" in valid.stdout
    tls = {"DANUBE_ADMIN_TLS": "true", "DANUBE_ADMIN_CA": str(pki.ca_file)}
    endpoint = ("--endpoint", secured.admin_addr)
    listed = _tool("danube-admin", *endpoint, "brokers", "namespaces",
                   env={**tls, "DANUBE_ADMIN_TOKEN": root})  # fmt: skip
    assert listed.returncode == 0 and "default" in listed.stdout, listed.stderr
    anonymous = _tool("danube-admin", *endpoint, "brokers", "namespaces", env=tls)
    assert anonymous.returncode == 1 and "UNAUTHENTICATED" in anonymous.stderr
    app = _tool("danube-admin", *endpoint, "brokers", "namespaces",
                env={**tls, "DANUBE_ADMIN_API_KEY": token("app")})  # fmt: skip
    assert app.returncode == 1 and "PERMISSION_DENIED" in app.stderr
    memory = _tool("danube-admin", *endpoint, "brokers", "memory", "-o", "json",
                   env={**tls, "DANUBE_ADMIN_TOKEN": root})  # fmt: skip
    assert memory.returncode == 0, memory.stderr
    assert "danube_memory_budget_bytes" in memory.stdout, memory.stdout  # read over TLS
    sent = _tool(
        "danube-cli", "produce", "-s", f"https://{secured.broker_addr}",
        "-t", fresh(), "-m", "hi", "--tls-ca", str(pki.ca_file),
        env={"DANUBE_TOKEN": token("app")},
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr


def test_no_secret_reaches_the_log(secured: BrokerProcess, pki: Pki) -> None:
    """Runs after the others in this module (same broker): every token they sent, good or
    bad, and the secret itself, must be absent from everything the broker logged."""
    used = token("app")
    aio_run(lambda: produce(secured, ClientSecurity(ca_file=str(pki.ca_file), token=used),
                            fresh()))  # fmt: skip
    refusal(secured, ClientSecurity(ca_file=str(pki.ca_file), token=used + "x"), "/default/s")
    log = secured.log_text()
    assert "event=broker_ready" in log and "auth=tls" in log
    for secret in (SECRET, used, used.split(".")[2]):
        assert secret not in log


def test_an_open_bind_without_auth_warns(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    with broker_factory(tmp_path / "open", extra_args=("--broker-addr", "0.0.0.0:0")) as open_:
        assert "event=unauthenticated_network_bind" in open_.log_text()
    with broker_factory(tmp_path / "loopback") as closed:
        assert "unauthenticated_network_bind" not in closed.log_text()


def test_roles_and_bindings_from_danube_admin_apply_at_once_and_persist(
    pki: Pki, tmp_path: Path
) -> None:
    """SecurityAdmin: the root super admin grants `carol` Produce on one topic; carol may
    produce there at once, not elsewhere, and still after a restart; deleting the binding
    takes it away again."""
    topic, elsewhere = fresh(), fresh()
    env = {"DANUBE_ADMIN_TLS": "1", "DANUBE_ADMIN_CA": str(pki.ca_file),
           "DANUBE_ADMIN_TOKEN": token("root")}  # fmt: skip
    carol = ClientSecurity(ca_file=str(pki.ca_file), token=token("carol"))
    with _secured(pki, tmp_path) as broker:

        def admin(*args: str) -> subprocess.CompletedProcess[str]:
            return _tool("danube-admin", "--endpoint", broker.admin_addr, "security", *args,
                         env=env)  # fmt: skip

        assert "PERMISSION_DENIED" in refusal(broker, carol, topic)
        made = admin("roles", "create", "writer", "--permissions", "Produce,Lookup")
        assert made.returncode == 0, made.stderr
        bad = admin("roles", "create", "bad", "--permissions", "Fly")
        assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr
        bound = admin("bindings", "create", "carol-w", "--principal-type", "service_account",
                      "--principal-name", "carol", "--roles", "writer", "--scope", "topic",
                      "--resource", topic.lstrip("/"))  # fmt: skip
        assert bound.returncode == 0, bound.stderr
        aio_run(lambda: produce(broker, carol, topic))
        assert "PERMISSION_DENIED" in refusal(broker, carol, elsewhere)
        broker.stop()
        broker.start()
        aio_run(lambda: produce(broker, carol, topic))
        assert "carol-w" in admin("bindings", "list").stdout
        gone = admin("bindings", "delete", "carol-w", "--scope", "topic", "--resource", topic)
        assert gone.returncode == 0, gone.stderr
        assert "PERMISSION_DENIED" in refusal(broker, carol, topic)
        app = _tool("danube-admin", "--endpoint", broker.admin_addr, "security", "roles", "list",
                    env={**env, "DANUBE_ADMIN_TOKEN": token("app")})  # fmt: skip
        assert app.returncode == 1 and "PERMISSION_DENIED" in app.stderr


@pytest.mark.conformance
def test_the_official_client_over_tls_with_a_token(secured: BrokerProcess, pki: Pki) -> None:
    """Issue 25, point 6: `danube-client==0.5.0` (grpcio) with `with_tls(ca)` and
    `with_token(jwt)` produces and consumes; without a token it gets UNAUTHENTICATED, with a
    token lacking Produce PERMISSION_DENIED (Danube's status codes)."""
    from tests.conformance.harness import run_scenario

    url, ca = f"https://{secured.broker_addr}", str(pki.ca_file)
    ok = run_scenario("secured", url, ca, token("app"), fresh(), broker=secured)
    assert ok["outcome"] == "ok" and ok["payload"] == "over tls"
    anonymous = run_scenario("secured", url, ca, "-", fresh(), broker=secured)
    assert anonymous["status"] == "UNAUTHENTICATED"
    reader = run_scenario("secured", url, ca, token("reader", "user"), fresh(), broker=secured)
    assert reader["status"] == "PERMISSION_DENIED" and "Produce" in reader["details"]


def test_an_unauthenticated_large_request_is_refused_before_it_is_read(
    secured: BrokerProcess, pki: Pki
) -> None:
    """A 4 MiB schema registration without credentials: the answer is UNAUTHENTICATED, not
    the INVALID_ARGUMENT of an over-long request, so the broker refused it from the headers
    without buffering, decoding or compiling anything; and it still answers afterwards."""
    from grpclib import GRPCError
    from grpclib.const import Status

    from danube.client.connection import BrokerChannel
    from danube.proto import danube_schema as schema_pb

    big = schema_pb.RegisterSchemaRequest(
        subject="huge", schema_type="json_schema", schema_definition=b"{" + b" " * (4 << 20)
    )

    async def scenario() -> Status:
        host, port = secured.broker_addr.split(":")
        channel = BrokerChannel(host, int(port), security(pki))
        try:
            await schema_pb.SchemaRegistryStub(channel).register_schema(big)
        except GRPCError as error:
            return error.status
        finally:
            channel.close()
        raise AssertionError("accepted")

    assert aio_run(scenario) is Status.UNAUTHENTICATED
    aio_run(lambda: produce(secured, security(pki, "app"), fresh()))


def test_every_method_refuses_cleanly_with_authentication_on(
    secured: BrokerProcess, pki: Pki
) -> None:
    """Issue 11's raw callers over TLS, against every method of both ports: without a token
    every served method answers UNAUTHENTICATED whatever bytes follow; with the token of a
    principal that has no binding, a clean refusal (PERMISSION_DENIED, or INVALID_ARGUMENT
    for bytes that do not decode; the health check needs authentication only), never
    INTERNAL, UNKNOWN, a dropped connection or no answer; the broker logs no traceback and
    keeps serving."""
    import random

    from grpclib.client import Channel

    from tests.hostile.rawcall import RawCaller, RawCodec, all_methods

    context = ClientSecurity(ca_file=str(pki.ca_file)).context()

    class TlsCaller(RawCaller):
        def __init__(self, address: str, auth: dict[str, str]) -> None:
            self.auth = auth
            super().__init__(address)

        def _open(self) -> Channel:
            channel = Channel(self.host, self.port, codec=RawCodec(), ssl=context)
            request = channel.request
            channel.request = lambda *a, **k: request(*a, **{**k, "metadata": self.auth})  # type: ignore[method-assign]
            return channel

    rng = random.Random(25)
    payloads = [[b""], [b"\xff" * 64], [rng.randbytes(200)], [b"\x0a\x03abc", b"\x0a\x03abc"]]
    nobody = {"authorization": f"Bearer {token('nobody')}"}
    outcomes: dict[str, set[str]] = {"anonymous": set(), "nobody": set()}
    unclean: list[str] = []

    async def scenario() -> None:
        for port, address in (("client", secured.broker_addr), ("admin", secured.admin_addr)):
            for who, auth in (("anonymous", {}), ("nobody", nobody)):
                caller = TlsCaller(address, auth)
                try:
                    for method in all_methods():
                        if not method.served_on(port):
                            continue
                        for messages in payloads:
                            status = await caller.call(method, messages, timeout=5.0)
                            outcomes[who].add(status)
                            clean = {"UNAUTHENTICATED"} if who == "anonymous" else {
                                "PERMISSION_DENIED", "INVALID_ARGUMENT", "UNIMPLEMENTED",
                            }  # fmt: skip
                            if method.short == "HealthCheck/HealthCheck" and who == "nobody":
                                clean = {"OK", "INVALID_ARGUMENT"}  # authentication only
                            if status not in clean:
                                unclean.append(f"{who} {port} {method.short}: {status}")
                finally:
                    caller.close()

    aio_run(scenario, timeout=300)
    assert unclean == []
    assert outcomes["anonymous"] == {"UNAUTHENTICATED"}
    assert "PERMISSION_DENIED" in outcomes["nobody"]
    assert "Traceback" not in secured.log_text()
    aio_run(lambda: produce(secured, security(pki, "app"), fresh()))


def test_the_mcp_server_reaches_a_secured_broker(secured: BrokerProcess, pki: Pki) -> None:
    """`danube-admin serve --mode mcp` takes danube-admin's TLS settings and token (here the
    environment, as an assistant's configuration would set it): a tool lists the namespaces
    as the root super admin; without the token the tool reports UNAUTHENTICATED."""
    anyio = pytest.importorskip("anyio")
    mcp = pytest.importorskip("mcp")
    from mcp.client.stdio import StdioServerParameters, stdio_client

    async def listed(env: dict[str, str]) -> tuple[bool, str]:
        params = StdioServerParameters(
            command=str(BIN / "danube-admin"),
            args=["--endpoint", secured.admin_addr, "serve", "--mode", "mcp"],
            env={**os.environ, **env},
        )
        async with stdio_client(params) as (read, write), mcp.ClientSession(read, write) as s:
            await s.initialize()
            result = await s.call_tool("list_namespaces", {})
            return result.is_error, "".join(block.text for block in result.content)

    tls = {"DANUBE_ADMIN_TLS": "1", "DANUBE_ADMIN_CA": str(pki.ca_file)}
    failed, text = anyio.run(listed, {**tls, "DANUBE_ADMIN_TOKEN": token("root")})
    assert not failed and "default" in text, text
    failed, text = anyio.run(listed, tls)
    assert failed and "UNAUTHENTICATED" in text, text

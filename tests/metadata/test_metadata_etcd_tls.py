"""A broker reaches etcd over TLS, with a client certificate when etcd requires one
(`meta_store.etcd_tls`, spec/security.md "etcd"): a real etcd started with `--cert-file` and
`--client-cert-auth`, certificates from trustme."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from danube.localcluster.etcd_process import EtcdProcess, EtcdServerTls
from danube.metadata.etcd import EtcdStore, EtcdUnavailable
from danube.runtime.tls import client_context
from danube.values.config import ConfigError, EtcdTls, config_from_mapping


class Pki:
    def __init__(self, root: Path) -> None:
        ca = trustme.CA()
        self.ca = root / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca))
        self.files: dict[str, tuple[str, str]] = {}
        for name in ("etcd", "broker"):
            issued = ca.issue_cert("127.0.0.1", "localhost", common_name=name)
            cert, key = root / f"{name}.pem", root / f"{name}.key"
            issued.cert_chain_pems[0].write_to_path(str(cert))
            issued.private_key_pem.write_to_path(str(key))
            self.files[name] = (str(cert), str(key))
        stranger = trustme.CA().issue_cert("127.0.0.1", common_name="stranger")
        cert, key = root / "stranger.pem", root / "stranger.key"
        stranger.cert_chain_pems[0].write_to_path(str(cert))
        stranger.private_key_pem.write_to_path(str(key))
        self.files["stranger"] = (str(cert), str(key))


@pytest.fixture(scope="module")
def secured_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EtcdProcess, Pki]]:
    root = tmp_path_factory.mktemp("etcd-tls")
    pki = Pki(root)
    cert, key = pki.files["etcd"]
    probe_cert, probe_key = pki.files["broker"]
    tls = EtcdServerTls(cert, key, str(pki.ca), str(pki.ca), probe_cert, probe_key)
    with EtcdProcess(root / "data", tls=tls) as server:
        yield server, pki


@pytest.mark.trio
async def test_a_store_over_mutual_tls_reads_writes_and_watches(
    secured_etcd: tuple[EtcdProcess, Pki],
) -> None:
    server, pki = secured_etcd
    context = client_context(str(pki.ca), *pki.files["broker"])
    async with await EtcdStore.connect(
        [server.url], prefix="/tls", timeout_s=5, ssl_context=context
    ) as store:
        async with store.watch("/w") as events:
            await store.put("/w/k", {"v": 1})
            event = await anext(events)
        assert event.key == "/w/k"
        found = await store.get("/w/k")
        assert found is not None and found.value == {"v": 1}


@pytest.mark.parametrize("who", ["none", "stranger"])
@pytest.mark.trio
async def test_without_a_certificate_etcd_trusts_the_store_is_refused_by_name(
    secured_etcd: tuple[EtcdProcess, Pki], who: str
) -> None:
    server, pki = secured_etcd
    files = () if who == "none" else pki.files["stranger"]
    context = client_context(str(pki.ca), *files)
    with pytest.raises(EtcdUnavailable, match=server.endpoint):
        await EtcdStore.connect([server.url], timeout_s=1, ssl_context=context)


@pytest.mark.trio
async def test_a_plain_store_does_not_reach_a_tls_etcd(
    secured_etcd: tuple[EtcdProcess, Pki],
) -> None:
    server, _ = secured_etcd
    with pytest.raises(EtcdUnavailable, match=server.endpoint):
        await EtcdStore.connect([server.endpoint], timeout_s=1)


@pytest.mark.trio
async def test_a_store_that_does_not_trust_etcds_ca_is_refused(
    secured_etcd: tuple[EtcdProcess, Pki],
) -> None:
    server, pki = secured_etcd
    context = client_context(None, *pki.files["broker"])  # the system's roots only
    with pytest.raises(EtcdUnavailable, match=server.endpoint):
        await EtcdStore.connect([server.url], timeout_s=1, ssl_context=context)


def test_the_configuration_takes_etcd_tls_and_refuses_mixing_schemes() -> None:
    def cluster(meta: dict[str, object]) -> object:
        return config_from_mapping({"meta_store": meta}).cluster

    tls = {"ca_file": "ca.pem", "cert_file": "b.pem", "key_file": "b.key"}
    got = cluster({"etcd_endpoints": ["10.0.0.1:2379"], "etcd_tls": tls})
    assert got.etcd_tls == EtcdTls("ca.pem", "b.pem", "b.key")  # type: ignore[attr-defined]
    https = cluster({"etcd_endpoints": ["https://10.0.0.1:2379"]})
    assert https.etcd_tls == EtcdTls()  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="do not mix"):
        cluster({"etcd_endpoints": ["http://10.0.0.1:2379"], "etcd_tls": tls})
    with pytest.raises(ConfigError, match="do not mix"):
        cluster({"etcd_endpoints": ["http://a:1", "https://b:2"]})
    with pytest.raises(ConfigError, match="expected host:port, http:// or https://"):
        cluster({"etcd_endpoints": ["grpc://10.0.0.1:2379"]})
    with pytest.raises(ConfigError, match="cert_file and key_file go together"):
        cluster({"etcd_endpoints": ["a:1"], "etcd_tls": {"cert_file": "b.pem"}})
    with pytest.raises(ConfigError, match=r"meta_store\.etcd_tls"):
        cluster({"etcd_endpoints": ["a:1"], "etcd_tls": {"cafile": "x"}})


@pytest.mark.trio
async def test_a_broker_configured_with_etcd_tls_opens_its_store_over_it(
    secured_etcd: tuple[EtcdProcess, Pki], tmp_path: Path
) -> None:
    from danube.runtime.server import _open_store

    server, pki = secured_etcd
    cert, key = pki.files["broker"]
    meta = {"etcd_endpoints": [server.endpoint], "prefix": "/broker-tls"}
    tls = {"ca_file": str(pki.ca), "cert_file": cert, "key_file": key}
    config = config_from_mapping({"meta_store": {**meta, "etcd_tls": tls}})
    config = dataclasses.replace(config, mode="cluster")
    store = await _open_store(config, tmp_path)
    async with store:
        await store.put("/k", 1)
        found = await store.get("/k")
        assert found is not None and found.value == 1
    missing = {**tls, "key_file": str(tmp_path / "nowhere.key")}
    config = config_from_mapping({"meta_store": {**meta, "etcd_tls": missing}})
    with pytest.raises(ConfigError, match=r"meta_store\.etcd_tls"):
        await _open_store(dataclasses.replace(config, mode="cluster"), tmp_path)

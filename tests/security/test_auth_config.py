"""`auth` and `admin_tls` in the broker's YAML and flags (`danube.values.auth_config`,
`danube.cli.broker_auth`): Danube's keys accepted, mistakes refused at start with the key
named, and the secret taken from the environment."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from danube.cli.broker import build_parser, load_config
from danube.values.config import ConfigError, config_from_mapping

TLS = {"cert_file": "c.pem", "key_file": "k.pem"}


def parse(auth: dict[str, object], **top: object) -> object:
    config = config_from_mapping({"auth": auth, **top})
    config.check_mode()
    return config.auth


def test_default_is_none() -> None:
    auth = config_from_mapping({}).auth
    assert auth.mode == "none" and not auth.enabled and not auth.tls_on("client")


def test_danubes_tls_mode() -> None:
    auth = parse({"mode": "tls", "tls": TLS, "jwt": {"secret_key": "s", "issuer": "danube-auth",
                                                      "expiration_time": 3600}})  # fmt: skip
    assert auth.enabled and all(auth.tls_on(p) for p in ("client", "admin", "metrics"))  # type: ignore[attr-defined]
    assert parse({"mode": "tls_with_jwt", "tls": TLS, "jwt": {"secret_key": "s"}}).mode == "tls"  # type: ignore[attr-defined]


def test_admin_tls_alone() -> None:
    auth = parse({"tls": TLS}, admin_tls=True)
    assert auth.tls_on("admin") and not auth.tls_on("client")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ({"mode": "tls"}, "cert_file"),
        ({"mode": "tls", "tls": TLS}, "auth.jwt"),
        ({"mode": "tls", "tls": TLS, "jwt": {}}, "auth.jwt"),
        ({"mode": "tls", "tls": TLS, "jwt": {"algorithm": "HS256"}}, "secret_key"),
        ({"mode": "tls", "tls": TLS, "jwt": {"algorithm": "RS256"}}, "public_key_file"),
        ({"mode": "tls", "tls": TLS, "jwt": {"algorithm": "none", "secret_key": "s"}}, "algorithm"),
        ({"mode": "open"}, "auth.mode"),
        ({"tls": {"cert_file": "c.pem"}}, "go together"),
        ({"tls": {**TLS, "verify_client": True}}, "ca_file"),
        ({"tls": TLS, "colour": 1}, "unknown"),
        ({"roles": [{"name": "r", "permissions": ["Produce", "Fly"]}]}, "Fly"),
        (
            {
                "bindings": [
                    {
                        "id": "b",
                        "principal_type": "user",
                        "principal_name": "u",
                        "roles": ["r"],
                        "scope": "galaxy",
                    }
                ]
            },
            "scope",
        ),
        (
            {
                "bindings": [
                    {
                        "id": "b",
                        "principal_type": "user",
                        "principal_name": "u",
                        "roles": ["r"],
                        "scope": "topic",
                    }
                ]
            },
            "resource_name",
        ),
        (
            {
                "bindings": [
                    {
                        "id": "b",
                        "principal_type": "user",
                        "principal_name": "u",
                        "roles": [],
                        "scope": "cluster",
                    }
                ]
            },
            "roles",
        ),
    ],
)
def test_mistakes_are_refused(auth: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(auth)


def test_cluster_mode_with_auth_needs_a_cluster_key_unlike_the_clients() -> None:
    """Brokers prove who they are to each other with tokens signed by `auth.cluster_key`: a
    secured cluster without one, or with the clients' token secret as one, is refused."""
    data: dict[str, Any] = {
        "auth": {"mode": "tls", "tls": TLS, "jwt": {"secret_key": "s"}},
        "meta_store": {"etcd_endpoints": ["127.0.0.1:2379"]},
        "storage": {"mode": "shared_fs", "durable": {"root": "/tmp/x"}},
    }
    config = config_from_mapping(data)
    with pytest.raises(ConfigError, match="cluster_key"):
        dataclasses.replace(config, mode="cluster").check_mode()
    data["auth"]["cluster_key"] = "s"
    with pytest.raises(ConfigError, match="must differ"):
        dataclasses.replace(config_from_mapping(data), mode="cluster").check_mode()
    data["auth"]["cluster_key"] = "another"
    dataclasses.replace(config_from_mapping(data), mode="cluster").check_mode()
    config_from_mapping(data).check_mode()  # standalone: the key is simply unused


def test_flags_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump({"auth": {"mode": "tls", "tls": TLS, "jwt": {"issuer": "i"}}}))
    monkeypatch.setenv("DANUBE_JWT_SECRET_KEY", "from-env")
    args = build_parser().parse_args(["--config-file", str(path), "--super-admin", "root"])
    auth = load_config(args).auth
    assert auth.jwt is not None and auth.jwt.secret_key == "from-env" and auth.jwt.issuer == "i"
    assert auth.super_admins == ("root",)
    monkeypatch.delenv("DANUBE_JWT_SECRET_KEY")
    with pytest.raises(ConfigError, match="secret_key"):
        load_config(build_parser().parse_args(["--config-file", str(path)]))
    flags = build_parser().parse_args(
        [
            "--auth-mode",
            "tls",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
            "--tls-ca",
            "ca",
            "--tls-verify-client",
        ]
    )
    auth = load_config(flags).auth
    assert auth.tls is not None and auth.tls.verify_client and auth.jwt is None

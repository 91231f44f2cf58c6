"""`broker.grpc` (the HTTP/2 connection guard's limits) and the keepalive flags."""

from __future__ import annotations

from typing import Any

import pytest

from danube.cli.broker import build_parser, load_config
from danube.values.config import ConfigError, GrpcConfig, config_from_mapping


def test_defaults() -> None:
    grpc = config_from_mapping({}).grpc
    assert grpc == GrpcConfig()
    assert (grpc.keepalive_time_ms, grpc.keepalive_timeout_ms) == (30_000, 20_000)
    assert (grpc.max_concurrent_streams, grpc.max_header_list_bytes) == (500, 16384)
    assert (grpc.max_stream_resets, grpc.stream_reset_window_ms) == (200, 10_000)
    assert (grpc.handshake_timeout_ms, grpc.frame_timeout_ms) == (10_000, 10_000)


def test_keys_under_broker_grpc() -> None:
    grpc = config_from_mapping(
        {"broker": {"grpc": {"keepalive_time_ms": 500, "max_stream_resets": 0}}}
    ).grpc
    assert grpc.keepalive_time_ms == 500
    assert grpc.max_stream_resets == 0
    assert grpc.keepalive_timeout_ms == 20_000


@pytest.mark.parametrize(
    ("grpc", "needle"),
    [
        ({"keepalive_ms": 1}, "broker.grpc: unknown key(s) keepalive_ms"),
        ({"keepalive_time_ms": 0}, "broker.grpc.keepalive_time_ms: expected an integer >= 1"),
        ({"max_concurrent_streams": "9"}, "broker.grpc.max_concurrent_streams"),
        (
            {"handshake_timeout_ms": -1},
            "broker.grpc.handshake_timeout_ms: expected an integer >= 0",
        ),
        ({"max_header_list_bytes": True}, "broker.grpc.max_header_list_bytes"),
    ],
)
def test_mistakes_name_the_key(grpc: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as raised:
        config_from_mapping({"broker": {"grpc": grpc}})
    assert needle in str(raised.value)


def test_keepalive_flags_override_the_file(tmp_path: Any) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text("broker:\n  grpc:\n    keepalive_time_ms: 500\n    max_stream_resets: 7\n")
    args = build_parser().parse_args(["--config-file", str(path), "--keepalive-timeout-ms", "900"])
    grpc = load_config(args).grpc
    assert (grpc.keepalive_time_ms, grpc.keepalive_timeout_ms) == (500, 900)
    assert grpc.max_stream_resets == 7
    args = build_parser().parse_args(["--keepalive-time-ms", "0"])
    with pytest.raises(ConfigError, match="keepalive_time_ms"):
        load_config(args)

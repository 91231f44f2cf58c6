"""`DANUBE_*` environment variables set `danube-broker`'s flags (danube.cli.environment):
a flag given wins, a bad value is a usage error naming the variable."""

from __future__ import annotations

import pytest

from danube.cli.broker import build_parser, load_config
from danube.cli.environment import apply_environment


def parsed(environ: dict[str, str], argv: list[str] | None = None) -> object:
    parser = build_parser()
    apply_environment(parser, environ)
    return parser.parse_args(argv or [])


def test_a_variable_sets_its_flag_and_a_flag_given_wins() -> None:
    args = parsed({"DANUBE_MEMORY_BUDGET": "256MiB", "DANUBE_BROKER_ADDR": "0.0.0.0:7000"})
    config = load_config(args)
    assert config.memory_budget == 256 * 2**20 and str(config.broker_addr) == "0.0.0.0:7000"
    args = parsed({"DANUBE_BROKER_ADDR": "0.0.0.0:7000"}, ["--broker-addr", "127.0.0.1:7001"])
    assert str(load_config(args).broker_addr) == "127.0.0.1:7001"


def test_typed_and_choice_values_are_converted_and_checked() -> None:
    args = parsed({"DANUBE_KEEPALIVE_TIME_MS": "5000", "DANUBE_MODE": "standalone"})
    assert args.keepalive_time_ms == 5000 and args.mode == "standalone"


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("DANUBE_MODE", "weird", "expected one of standalone, cluster"),
        ("DANUBE_KEEPALIVE_TIME_MS", "soon", "invalid literal"),
        ("DANUBE_LOG_LEVEL", "loud", "expected one of debug"),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_the_variable(
    name: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parsed({name: value})
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{name}={value!r}" in err and says in err


def test_actions_are_no_settings() -> None:
    args = parsed({"DANUBE_WARM_KERNELS": "true", "DANUBE_CONFIG_FILE": "/nope.yml"})
    assert args.warm_kernels is False and args.config_file is None

"""Environment overrides of `danube-broker`'s flags: every flag `--some-flag` may be given as
`DANUBE_SOME_FLAG` instead, as containers and service managers prefer. Precedence: a flag on
the command line, then its environment variable, then the configuration file, then the
default (spec/configuration.md).

A value from the environment is checked as the flag's value would be, and a bad one is a
usage error naming the variable (exit 2), not the flag the user never typed."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

PREFIX = "DANUBE_"
SKIPPED = frozenset({"help", "version", "completion", "warm_kernels", "config_file"})
"""Flags that are actions, not settings (and the file itself, which names where settings
come from: a variable for it would hide a file an operator passes)."""
TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off", ""})


def variable(action: argparse.Action) -> str:
    """`--memory-budget` -> `DANUBE_MEMORY_BUDGET`."""
    return PREFIX + action.option_strings[-1].lstrip("-").replace("-", "_").upper()


def settings(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags that take an environment override, in `--help` order."""
    return [
        action
        for action in parser._actions
        if action.option_strings
        and action.dest not in SKIPPED
        and action.option_strings[-1].startswith("--")
    ]


def apply_environment(
    parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None
) -> None:
    """Makes each set `DANUBE_*` variable its flag's default, after checking it."""
    environ = os.environ if environ is None else environ
    for action in settings(parser):
        name = variable(action)
        text = environ.get(name)
        if text is None:
            continue
        if action.nargs == 0:  # a switch
            lowered = text.strip().lower()
            if lowered not in TRUE | FALSE:
                parser.error(f"{name}={text!r}: expected true or false")
            action.default = lowered in TRUE
            continue
        try:
            value = action.type(text) if callable(action.type) else text
        except (ValueError, TypeError, argparse.ArgumentTypeError) as error:
            parser.error(f"{name}={text!r}: {error}")
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(str, action.choices))
            parser.error(f"{name}={text!r}: expected one of {choices}")
        action.default = value

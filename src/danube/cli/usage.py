"""What the command-line tools share: the service address flag, reading a named file,
`--version` and shell completion.

`--version` and the completion script import what they need (importlib.metadata, shtab) only
when asked: every tool's `--help` stays under 0.3 s (issue 26, bench/RESULTS.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from danube.client.security import ClientSecurity

DEFAULT_SERVICE = "http://127.0.0.1:6650"
ADMIN_ENV_PREFIX = "DANUBE_ADMIN_"
"""Danube's `danube-admin` environment: DANUBE_ADMIN_TLS, _CA, _CERT, _KEY, _DOMAIN, _TOKEN."""
CLIENT_ENV_PREFIX = "DANUBE_"
"""`danube-cli`'s (ours; Danube's has none): DANUBE_TLS, DANUBE_CA, ..., DANUBE_TOKEN."""
DISTRIBUTION = "pydanube"
SHELLS = ("bash", "zsh", "tcsh")


EXIT_USAGE = 2
"""argparse's exit status for bad usage; the tools use it for the usage errors the parser
cannot see too, so a script tells a typo from a refusal."""


class UsageError(Exception):
    """Bad flags the parser cannot see (for example `-m` and `-f` both missing, or a file
    named on the command line that cannot be read): exit status 2."""


class BadInput(Exception):
    """Well-formed flags whose input does not fit (a payload its schema rejects): exit 1, as
    a broker's refusal."""


def add_service_addr(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-s", "--service-addr", default=DEFAULT_SERVICE,
        help=f"broker URL, or several of a cluster comma-separated (default {DEFAULT_SERVICE})",
    )  # fmt: skip
    add_tls_arguments(parser, CLIENT_ENV_PREFIX)


def add_tls_arguments(parser: argparse.ArgumentParser, prefix: str) -> None:
    """TLS and token flags; each falls back to `<prefix>TLS`, `_CA`, ... in the environment."""
    parser.add_argument(
        "--tls", action="store_true", help=f"connect over TLS (env {prefix}TLS; https:// too)"
    )
    parser.add_argument("--tls-ca", help=f"CA file the broker's certificate chains to ({prefix}CA)")
    parser.add_argument("--tls-cert", help=f"client certificate, mutual TLS ({prefix}CERT)")
    parser.add_argument("--tls-key", help=f"its private key ({prefix}KEY)")
    parser.add_argument(
        "--tls-domain", help=f"name the broker's certificate carries ({prefix}DOMAIN)"
    )
    parser.add_argument(
        "--token", help=f"bearer token sent on every call; prefer the env {prefix}TOKEN"
    )


def security_of(args: argparse.Namespace, prefix: str, url: str = "") -> ClientSecurity:
    from danube.client.security import from_environment  # ssl: only when connecting

    return from_environment(
        prefix,
        url or getattr(args, "service_addr", ""),
        tls=args.tls,
        ca_file=args.tls_ca,
        cert_file=args.tls_cert,
        key_file=args.tls_key,
        domain=args.tls_domain,
        token=args.token,
    )


def read_input(path: Path) -> bytes:
    """A file the user named (payload, schema), or a one-line error saying why not."""
    try:
        return path.read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror}") from None


def render_bytes(payload: bytes) -> str:
    """UTF-8 text as it is; anything else as its length and the first bytes in hex."""
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return f"<{len(payload)} bytes> {payload[:32].hex()}"


def package_version() -> str:
    """The installed distribution's version (the one pip and `pip show` report)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed)"


class _Version(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"{parser.prog} {package_version()}")
        parser.exit()


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-V", "--version", action=_Version)


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script shtab generates from `parser` itself, so it is always current."""
    import shtab

    return str(shtab.complete(parser, shell=shell))


def completion_help(prog: str, how: str) -> str:
    """How to install the script `how` (e.g. `completion bash`) prints."""
    return (
        "Install (the script is generated from this program's own options, so it is always "
        "current):\n"
        f"  bash:  {prog} {how.format(shell='bash')} > "
        f"~/.local/share/bash-completion/completions/{prog}\n"
        f'  zsh:   {prog} {how.format(shell="zsh")} > "${{fpath[1]}}/_{prog}"   '
        "(then restart zsh)\n"
        f"  tcsh:  {prog} {how.format(shell='tcsh')} > ~/.{prog}.tcsh\n"
        f"         and add `source ~/.{prog}.tcsh` to ~/.tcshrc\n"
    )


class _Completion(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, _: Any, shell: Any, *__: Any) -> None:
        sys.stdout.write(completion_script(parser, str(shell)) + "\n")
        parser.exit()


def add_completion_flag(parser: argparse.ArgumentParser) -> None:
    """`--completion SHELL` for a tool without subcommands (danube-broker,
    danube-local-cluster); the others have a `completion SHELL` command."""
    parser.add_argument(
        "--completion", choices=SHELLS, action=_Completion, default=argparse.SUPPRESS,
        help="print a shell completion script and exit (--completion bash > "
        f"~/.local/share/bash-completion/completions/{parser.prog})",
    )  # fmt: skip


def add_completion_command(commands: argparse._SubParsersAction, prog: str) -> None:  # type: ignore[type-arg]
    completion = commands.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script for bash, zsh or tcsh on stdout.",
        epilog=completion_help(prog, "completion {shell}"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    completion.add_argument("shell", choices=SHELLS)

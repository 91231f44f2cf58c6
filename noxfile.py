"""Developer sessions. They run inside the environment that `scripts/bootstrap.sh` prepared
(`.venv`), so CI and a fresh machine install exactly once and every session sees the same pins."""

from __future__ import annotations

import os
import pathlib

import nox

ROOT = pathlib.Path(__file__).parent
PROTO_DIR = ROOT / "proto"
GENERATED_DIR = ROOT / "src" / "danube" / "proto"

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "tests"]


def generate_protos(session: nox.Session, out_dir: pathlib.Path) -> None:
    """Runs protoc with the betterproto plugin from this environment's bin directory."""
    out_dir.mkdir(parents=True, exist_ok=True)
    bin_dir = pathlib.Path(os.sys.executable).parent
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.glob("*.proto"))
    session.run(
        "python",
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"--python_betterproto_out={out_dir}",
        *protos,
        env=env,
        external=True,
    )


@nox.session
def protos(session: nox.Session) -> None:
    """Regenerates the committed betterproto code from proto/."""
    for old in GENERATED_DIR.glob("*/__init__.py"):
        old.unlink()
    generate_protos(session, GENERATED_DIR)
    (GENERATED_DIR / "__init__.py").write_text(
        '"""Generated wire types (betterproto). Regenerate with `nox -s protos`; never edit."""\n'
    )


@nox.session
def lint(session: nox.Session) -> None:
    session.run(
        "ruff", "check", "src", "tests", "sim", "bench", "spark", "noxfile.py", external=True
    )
    session.run(
        "ruff",
        "format",
        "--check",
        "src",
        "tests",
        "sim",
        "bench",
        "spark",
        "noxfile.py",
        external=True,
    )


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite, slow and conformance tests included (this is what CI runs)."""
    session.run("pytest", "-q", *session.posargs, external=True)


@nox.session
def fast(session: nox.Session) -> None:
    """Unit and property tests only: no broker processes, no official client."""
    session.run(
        "pytest", "-q", "-m", "not slow and not conformance", *session.posargs, external=True
    )

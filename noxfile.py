"""Developer sessions. They run inside the environment that `scripts/bootstrap.sh` prepared
(`.venv`: the project with its broker, dev, audit and bench extras, installed with
`-c constraints.txt`), so CI and a fresh machine install exactly once and every session sees
the same pins; the sessions install nothing themselves."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import nox

ROOT = pathlib.Path(__file__).parent
PROTO_DIR = ROOT / "proto"
GENERATED_DIR = ROOT / "src" / "danube" / "proto"
GENERATED_PACKAGE_DOC = (
    '"""Generated wire types (betterproto). Regenerate with `nox -s protos`; never edit."""\n'
)

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "tests"]


def generate_protos(out_dir: pathlib.Path) -> None:
    """Compiles proto/ with the betterproto plugin into out_dir.

    Shared by the `protos` session and tests/wire/test_generated_current.py, so the freshness check
    regenerates exactly what the session commits. The interpreter is this environment's (not
    whatever `python` is first on PATH), and its bin directory goes first on PATH because protoc
    finds `protoc-gen-python_betterproto` there.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    bin_dir = pathlib.Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    protos = sorted(p.name for p in PROTO_DIR.glob("*.proto"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"--python_betterproto_out={out_dir}",
            *protos,
        ],
        cwd=PROTO_DIR,
        env=env,
        check=True,
    )
    (out_dir / "__init__.py").write_text(GENERATED_PACKAGE_DOC)


@nox.session
def protos(session: nox.Session) -> None:
    """Regenerates the committed betterproto code from proto/."""
    for old in GENERATED_DIR.glob("*/__init__.py"):
        old.unlink()
    session.log(f"protoc {PROTO_DIR} -> {GENERATED_DIR}")
    try:
        generate_protos(GENERATED_DIR)
    except subprocess.CalledProcessError as exc:
        session.error(f"protoc failed with exit code {exc.returncode}")


@nox.session
def config_reference(session: nox.Session) -> None:
    """Regenerates spec/configuration.md from the broker's parser and configuration loader."""
    from danube.cli.config_reference import render

    (ROOT / "spec" / "configuration.md").write_text(render())


@nox.session
def kernels(session: nox.Session) -> None:
    """Compiles the kernels ahead of time for this machine (danube/kernels/_aot*.so), as
    scripts/bootstrap.sh does; `nox -s kernels -- --force` rebuilds a current module."""
    session.run("python", "-m", "danube.cli.build_kernels", *session.posargs, external=True)


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
    """The whole suite, slow and conformance tests included (this is what CI runs). The 30
    slowest tests are listed at the end, so that a CI log shows where its time goes."""
    session.run("pytest", "-q", "--durations=30", *session.posargs, external=True)


@nox.session
def fast(session: nox.Session) -> None:
    """Unit and property tests only: no broker processes, no official client."""
    session.run(
        "pytest", "-q", "-m", "not slow and not conformance", *session.posargs, external=True
    )


@nox.session
def bench(session: nox.Session) -> None:
    """Micro benchmarks (pytest-benchmark) and the end-to-end broker benchmark."""
    session.run("pytest", "-q", "bench", "--benchmark-only", *session.posargs, external=True)
    session.run("python", "-m", "bench.e2e_nonreliable", external=True)


@nox.session
def fuzz(session: nox.Session) -> None:
    """Many simulator seeds with the default fault profile: `nox -s fuzz -- 500` or
    FUZZ_SEEDS=500 (default 200); FUZZ_FIRST_SEED moves the window. Further arguments go to
    `python -m sim` (for example `--profile heavy --duration 20`, or `--swarm`: each seed draws
    which faults and workload features are on, sim/README.md "Swarm testing").
    The seeds run in one worker process per CPU (`--jobs N` to choose)."""
    args = list(session.posargs)
    seeds = args.pop(0) if args and args[0].isdigit() else os.environ.get("FUZZ_SEEDS", "200")
    first = os.environ.get("FUZZ_FIRST_SEED", "1")
    session.run(
        sys.executable, "-m", "sim", "--seed", first, "--seeds", seeds, *args, external=True
    )


@nox.session
def sim_long(session: nox.Session) -> None:
    """An hour of simulated time: seeds 1-6 of 600 simulated seconds each, default faults
    (issue 22: long runs that find rare interleavings, judged by safety at every moment and
    by the drain's progress rule at the end). SIM_LONG_SEEDS and SIM_LONG_FIRST_SEED move the
    window; further arguments go to `python -m sim` (`nox -s sim_long -- --profile heavy`)."""
    seeds = os.environ.get("SIM_LONG_SEEDS", "6")
    first = os.environ.get("SIM_LONG_FIRST_SEED", "1")
    session.run(
        sys.executable, "-m", "sim", "--seed", first, "--seeds", seeds, "--duration", "600",
        *session.posargs, external=True,
    )  # fmt: skip


@nox.session
def sim(session: nox.Session) -> None:
    """One simulator run, for replaying a seed: `nox -s sim -- --seed 42 --duration 10`."""
    session.run(sys.executable, "-m", "sim", *session.posargs, external=True)


@nox.session
def hostile(session: nox.Session) -> None:
    """The hostile-input suite alone (it also runs within `tests`), printing its numbers and
    writing them to bench/hostile.json: `nox -s hostile`; HOSTILE_EXAMPLES and the other
    HOSTILE_* variables size it (tests/hostile)."""
    session.run(sys.executable, "-m", "bench.hostile", *session.posargs, external=True)

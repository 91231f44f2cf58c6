#!/usr/bin/env bash
# Installs what is needed, then runs lint and the whole test suite (slow and conformance tests
# included). Extra arguments go to pytest, e.g. `scripts/test.sh -k shared`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# Sessions run inside .venv (nox's venv_backend "none"): its tools must come first on PATH.
export PATH="$PWD/.venv/bin:$PATH"
.venv/bin/nox -s lint
.venv/bin/nox -s tests -- "$@"

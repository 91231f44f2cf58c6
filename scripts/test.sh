#!/usr/bin/env bash
# Installs what is needed, then runs lint, the whole test suite (slow and conformance tests
# included) and the simulator's four fuzz runs (scripts/fuzz.sh, which says how many seeds
# of what). The fuzz runs go on beside the tests at idle CPU priority (SCHED_IDLE: they take
# only CPU time the tests leave unused, so the tests' real processes and timings are as
# without them); their log follows the tests' output. Extra arguments go to pytest, e.g.
# `scripts/test.sh -k shared`. Exit status 0 only when lint, the tests and every fuzz seed
# passed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# Sessions run inside .venv (nox's venv_backend "none"): its tools must come first on PATH.
export PATH="$PWD/.venv/bin:$PATH"
.venv/bin/nox -s lint
fuzz_log="$(mktemp -t danube-fuzz.XXXXXX)"
if command -v chrt > /dev/null && chrt --idle 0 true 2> /dev/null; then
    idle=(chrt --idle 0)
else
    idle=(nice -n 19)
fi
# its own process group (setsid), so that stopping it stops nox, the simulator and its workers
setsid "${idle[@]}" bash scripts/fuzz.sh > "$fuzz_log" 2>&1 &
fuzz_pid=$!
stop_fuzz() { kill -- "-$fuzz_pid" 2> /dev/null || true; }
trap 'stop_fuzz; rm -f "$fuzz_log"' EXIT
trap 'exit 143' INT TERM
tests_status=0
.venv/bin/nox -s tests -- "$@" || tests_status=$?
if [ "$tests_status" -ne 0 ]; then
    stop_fuzz
    echo "tests failed (exit $tests_status); the fuzz runs were stopped" >&2
    exit "$tests_status"
fi
echo "tests passed; waiting for the fuzz runs (scripts/fuzz.sh, started beside them)" >&2
fuzz_status=0
wait "$fuzz_pid" || fuzz_status=$?
tr '\r' '\n' < "$fuzz_log" | grep -v '^\[#*\.*\] ' || true
exit "$fuzz_status"

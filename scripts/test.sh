#!/usr/bin/env bash
# Installs what is needed, then runs lint, the whole test suite (slow and conformance tests
# included) and four simulator fuzz runs, each a swarm run (each seed draws its faults and
# workload): FUZZ_SEEDS, default 300, over the default faults; FUZZ_TIERED_SEEDS, default 100,
# tiered with the heavy profile; FUZZ_SCHEMA_SEEDS, default 50, the schema registry with the
# heavy profile; FUZZ_REPLICATED_SEEDS, default 100, a cluster whose topics replicate (the
# `peers` profile: faults between brokers too).
# Extra arguments go to pytest, e.g. `scripts/test.sh -k shared`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# Sessions run inside .venv (nox's venv_backend "none"): its tools must come first on PATH.
export PATH="$PWD/.venv/bin:$PATH"
.venv/bin/nox -s lint
.venv/bin/nox -s tests -- "$@"
# Swarm testing over the default faults: each seed draws which faults are on and its workload
# (topics, load, consumers, subscription types, durability, an operator changing settings...).
FUZZ_SEEDS="${FUZZ_SEEDS:-300}" .venv/bin/nox -s fuzz -- --swarm
# The heavy profile (bit flips, more crashes) with the object tier: what the default run skips.
FUZZ_FIRST_SEED=1001 .venv/bin/nox -s fuzz -- "${FUZZ_TIERED_SEEDS:-100}" --tiered --profile heavy --swarm
# Producers evolving schemas under every compatibility mode, through brokers under faults.
FUZZ_FIRST_SEED=2001 .venv/bin/nox -s fuzz -- "${FUZZ_SCHEMA_SEEDS:-50}" --schemas --profile heavy --swarm
# A cluster of brokers whose topics replicate their WAL tail before acknowledging, under
# crashes, kills, partitions and etcd stalls, and (the `peers` profile) faults between brokers:
# one cut off from etcd only, two cut from each other, slow links (issue 27; r1, r2, r3).
FUZZ_FIRST_SEED=3001 .venv/bin/nox -s fuzz -- "${FUZZ_REPLICATED_SEEDS:-100}" --cluster --replicated --profile peers --swarm --duration 15

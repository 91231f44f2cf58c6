#!/usr/bin/env bash
# The simulator's fuzz runs of CI, each a swarm run (each seed draws its faults and workload):
# FUZZ_SEEDS, default 600, over the default faults; FUZZ_TIERED_SEEDS, default 200, tiered
# with the heavy profile; FUZZ_SCHEMA_SEEDS, default 100, the schema registry with the heavy
# profile; FUZZ_REPLICATED_SEEDS, default 200, a cluster whose topics replicate (the `peers`
# profile: faults between brokers too). Each run spreads its seeds over one worker process
# per CPU (`python -m sim --jobs`); a seed's outcome does not depend on it. Needs the .venv
# that scripts/bootstrap.sh makes. Exit status 1 when any seed of any run failed (all four
# run whatever the others found).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
status=0
# Swarm testing over the default faults: each seed draws which faults are on and its workload
# (topics, load, consumers, subscription types, durability, an operator changing settings...).
FUZZ_SEEDS="${FUZZ_SEEDS:-600}" .venv/bin/nox -s fuzz -- --swarm || status=1
# The heavy profile (bit flips, more crashes) with the object tier: what the default run skips.
FUZZ_FIRST_SEED=1001 .venv/bin/nox -s fuzz -- "${FUZZ_TIERED_SEEDS:-200}" --tiered --profile heavy --swarm || status=1
# Producers evolving schemas under every compatibility mode, through brokers under faults.
FUZZ_FIRST_SEED=2001 .venv/bin/nox -s fuzz -- "${FUZZ_SCHEMA_SEEDS:-100}" --schemas --profile heavy --swarm || status=1
# A cluster of brokers whose topics replicate their WAL tail before acknowledging, under
# crashes, kills, partitions and etcd stalls, and (the `peers` profile) faults between brokers:
# one cut off from etcd only, two cut from each other, slow links (issue 27; r1, r2, r3).
FUZZ_FIRST_SEED=3001 .venv/bin/nox -s fuzz -- "${FUZZ_REPLICATED_SEEDS:-200}" --cluster --replicated --profile peers --swarm --duration 15 || status=1
exit "$status"

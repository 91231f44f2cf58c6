"""A restart's deferred WAL loads (issue 23 point 3, `danube.machines.node.deferred_loads`)
under the simulator: with three topics, the sweep loading one at a time and a stored topic's
directory taking 20 ms to read (`sim.broker_io.SCAN_US`), clients come back to topics whose
load has not started, so their first use starts it. Crashes, power failures and damage to the
newest segment still lose nothing acknowledged and stop only damaged topics; and two planted
bugs of the deferral are caught."""

from __future__ import annotations

import dataclasses

import pytest

from danube.machines.node.deferred_loads import DeferredLoads
from sim.__main__ import PROFILES, report
from sim.run import Simulation, Workload
from tests.sim.mutations import LAZY_LOAD_MUTATIONS

HEAVY = PROFILES["heavy"]
DAMAGING = dataclasses.replace(HEAVY, newest_damage=0.05)
WORKLOAD = Workload(topics=3)


def test_restarts_with_deferred_loads_lose_nothing_and_stop_only_damaged_topics() -> None:
    wanted = 0
    original = DeferredLoads.want

    def counting(self: DeferredLoads, topic: str) -> None:
        nonlocal wanted
        wanted += self.pending(topic)
        original(self, topic)

    stopped = 0
    DeferredLoads.want = counting  # type: ignore[method-assign]
    try:
        for seed in range(1, 9):
            result = Simulation(seed, WORKLOAD, DAMAGING).run(3)
            assert result.ok, report(result, WORKLOAD, DAMAGING)
            stopped += len(result.stopped_topics)
    finally:
        DeferredLoads.want = original  # type: ignore[method-assign]
    assert wanted > 0  # requests did reach topics whose load had not started
    assert stopped > 0  # and damage was found in lazily loaded topics


@pytest.mark.parametrize("mutation", sorted(LAZY_LOAD_MUTATIONS))
def test_a_planted_bug_in_the_deferred_loads_is_caught(mutation: str) -> None:
    with LAZY_LOAD_MUTATIONS[mutation]():
        for seed in range(1, 21):
            result = Simulation(seed, WORKLOAD, HEAVY).run(3)
            if not result.ok:
                text = report(result, WORKLOAD, HEAVY)
                assert result.violations[0].invariant.startswith(("15", "2 ", "4 ", "4b")), text
                return
    pytest.fail(f"the simulator did not catch {mutation} in 20 seeds")


FOUND_1100 = (
    "--seed 1100 --duration 10 --tiered --profile none --topics 3 --producers 1 "
    "--subscriptions exclusive,failover,key_shared --keys 16 --durability flush "
    "--synced-writes --max-unacked 1 --ack-delay-ms 0 --nack 0.005 --segment-bytes 8192 "
    "--cache-bytes 65536 --retention-bytes 0 --operator 0.05 --batched 0.0 --partition 0.025 "
    "--slow-fsync 0.05 --disk-full 0.04 --bit-flip 0.005 --clock-jump 0.02 "
    "--s3-server-error 0.025"
)


def test_the_final_check_waits_for_the_restarts_deferred_loads() -> None:
    # Found by CI's tiered fuzz run: a bit flipped in a sealed segment of /default/sim-2, and
    # the final check read the disk right after the last restart, before the sweep had loaded
    # (and so stopped) that topic: "segment 46 is damaged", "offsets jump from 50 to 54".
    from sim.__main__ import _parser, _workload, chosen_faults

    args = _parser().parse_args(FOUND_1100.split())
    workload, faults = _workload(args), chosen_faults(args, PROFILES)
    result = Simulation(args.seed, workload, faults).run(args.duration)
    assert result.ok, report(result, workload, faults)
    assert "/default/sim-2" in result.stopped_topics  # the damaged topic, stopped by its load


def test_a_dead_letter_topic_still_loading_neither_spins_nor_goes_uncharged() -> None:
    # Found by CI's default fuzz run (seed 257, swarm): after a restart the dead-letter topic's
    # load was deferred; under a zero redelivery delay its failed republish was asked again in
    # the same call, for ever (the run never ended). With a floor on the retry, the topic
    # auto-created by the dead-letter path went uncharged until the next tick (invariant 18).
    from sim.__main__ import _parser, _workload, chosen_faults, swarm_draw

    args = _parser().parse_args(["--seed", "257", "--swarm"])
    drawn = swarm_draw(257, _workload(args), chosen_faults(args, PROFILES), set())
    result = Simulation(257, drawn.workload, drawn.faults).run(10)
    assert result.ok, report(result, drawn.workload, drawn.faults)

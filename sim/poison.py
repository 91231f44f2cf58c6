"""Poison messages (`--poison drop|block`, issue 24): every consumer nacks the poison
messages every time (a quarter of those of one routing key, `POISON_KEY`, chosen by payload:
`sim.clients.is_poison`), and each judged subscription has a failure policy with
`max_redelivery_count = Workload.poison_limit` and the chosen poison policy, set before the
subscriptions exist (as an operator may). Under Block an operator sweeps the blocked
messages every `SWEEP_US`, releasing some (they fail again and block again) and skipping the
rest, so the drain can finish.

Judged (invariant 17, sim/checker.py): a message dropped by policy had at least
`poison_limit + 1` sends first; the cursor passes only what a consumer acknowledged or the
policy dropped; Key-Shared never sends a later message of a blocked key first (invariants 3
and 5, with dropped offsets settled); and at the end every acknowledged message is, for every
judged subscription, acknowledged by a consumer or dropped by policy — never neither."""

from __future__ import annotations

from typing import Any

from danube.machines.node.settings import PoisonPolicy, SubscriptionFailureSettings
from danube.values.errors import DanubeError
from sim.broker import SimBroker
from sim.checker import POISON, InvariantChecker
from sim.world import World

POISON_KEY = "k0"
SWEEP_US = 250_000
RELEASE = 0.3
"""Chance that the operator releases a blocked message rather than skipping it."""
POLICIES = {"drop": PoisonPolicy.DROP, "block": PoisonPolicy.BLOCK}


def failure_settings(poison: str, limit: int, **fields: Any) -> SubscriptionFailureSettings:
    """The poison workload's policy (a short ack timeout: consumers never stay silent here,
    and the run should not wait 30 s for a lost nack)."""
    options: dict[str, Any] = dict(
        ack_timeout_ms=2_000, base_redelivery_delay_ms=50, max_redelivery_delay_ms=500
    )
    options.update(fields)
    return SubscriptionFailureSettings(
        max_redelivery_count=limit, poison_policy=POLICIES[poison], **options
    )


class PoisonDuty:
    def __init__(
        self,
        world: World,
        broker: SimBroker,
        checker: InvariantChecker,
        judged: list[tuple[str, str]],
        poison: str,
        limit: int,
    ) -> None:
        self.world = world
        self.broker = broker
        self.checker = checker
        self.judged = judged
        self.poison = poison
        self.limit = limit
        checker.redelivery_limit = limit
        self.released = 0
        self.skipped = 0

    def set_policies(self) -> None:
        """Before the subscriptions exist: each takes the policy when it is created."""
        core = self.broker.core
        assert core is not None
        for topic, sub in self.judged:
            policy = failure_settings(self.poison, self.limit)
            self.broker._apply(core.set_failure_policy(topic, sub, policy, now_ms=0).effects)

    def start(self) -> None:
        if self.poison == "block":
            self.world.at(SWEEP_US, self._sweep)

    def _sweep(self) -> None:
        """The operator's look at blocked messages (nothing while the broker is down)."""
        core, rng = self.broker.core, self.world.rng
        if core is not None and self.broker.up:
            for topic, sub in self.judged:
                for offset in core.blocked(topic, sub):
                    release = rng.random() < RELEASE
                    try:
                        step = core.resolve_blocked(
                            topic, sub, offset, release=release, now_ms=self.broker.now_ms
                        )
                    except DanubeError:
                        continue
                    if step.value and release:
                        self.checker.policy_released(topic, sub, offset)
                    if step.value:
                        self.released += release
                        self.skipped += not release
                        self.world.log(
                            f"operator {'release' if release else 'skip'} {topic}/{sub} {offset}"
                        )
                    self.broker._apply(step.effects)
        self.world.at(SWEEP_US, self._sweep)

    def settled(self) -> bool:
        return not any(self.checker.unsettled(t, s) for t, s in self.judged)

    def judge_end(self) -> None:
        """After the drain: every acknowledged message settled for every subscription."""
        for topic, sub in self.judged:
            if topic in self.broker.stopped_topics:
                continue
            left = self.checker.unsettled(topic, sub)
            if left:
                self.checker._violate(
                    POISON,
                    f"{topic}/{sub}: {len(left)} acknowledged message(s) neither acknowledged "
                    f"by a consumer nor dropped by policy, e.g. {sorted(left)[:3]}",
                )

"""Poison messages (`--poison drop|block|dead_letter`, issue 24): every consumer nacks the poison
messages every time (a quarter of those of one routing key, `POISON_KEY`, chosen by payload:
`sim.clients.is_poison`), and each judged subscription has a failure policy with
`max_redelivery_count = Workload.poison_limit` and the chosen poison policy (exponential
backoff from 50 ms capped at 80 ms, so the cap binds from the second failure), set before the
subscriptions exist (as an operator may). Under Block an operator sweeps the blocked
messages every `SWEEP_US`, releasing some (they fail again and block again) and skipping the
rest, so the drain can finish. Under DeadLetter each topic's poison goes to its own
dead-letter topic (`dead_letter_topic`), which the broker creates on the first dead letter.

Judged (invariant 17, sim/checker.py): a nacked message waits no longer than the policy's
cap before it goes out again; a message dropped or dead-lettered by policy had at least
`poison_limit + 1` sends first; the cursor passes only what a consumer acknowledged or the
policy dropped or the dead-letter topic stored; a dead letter is reported only once its topic
acknowledged it, holding the original's payload and pointing back to it (`x-original-*`);
Key-Shared never sends a later message of a blocked key first (invariants 3 and 5, with
dropped offsets settled); and at the end every acknowledged message is, for every judged
subscription, acknowledged by a consumer, stored in the dead-letter topic or dropped by
policy — never none. Failure counts survive a restart (spec/failure-policies.md, "What is
persisted"): a message the restarted broker sends never counts fewer failures than the
store held for it when the broker started (unless an operator released it since)."""

from __future__ import annotations

from typing import Any

from danube import keys
from danube.machines.node.settings import PoisonPolicy, SubscriptionFailureSettings
from danube.values.errors import DanubeError
from danube.values.names import parse_topic
from sim.broker import SimBroker, SubscriptionRecordView
from sim.checker import POISON, InvariantChecker
from sim.world import World

POISON_KEY = "k0"
SWEEP_US = 250_000
RELEASE = 0.3
"""Chance that the operator releases a blocked message rather than skipping it."""
POLICIES = {
    "drop": PoisonPolicy.DROP,
    "block": PoisonPolicy.BLOCK,
    "dead_letter": PoisonPolicy.DEAD_LETTER,
}


def dead_letter_topic(topic: str) -> str:
    return f"{topic}-dlq"


def failure_settings(
    poison: str, limit: int, topic: str, **fields: Any
) -> SubscriptionFailureSettings:
    """The poison workload's policy for a subscription of `topic` (a short ack timeout:
    consumers never stay silent here, and the run should not wait 30 s for a lost nack)."""
    options: dict[str, Any] = dict(
        ack_timeout_ms=2_000, base_redelivery_delay_ms=50, max_redelivery_delay_ms=80
    )
    options.update(fields)
    if poison == "dead_letter":
        options["dead_letter_topic"] = dead_letter_topic(topic)
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
        if poison == "dead_letter":
            for topic, _ in judged:
                checker.dead_letters.setdefault(dead_letter_topic(topic), {})
        self.released = 0
        self.skipped = 0
        self.stored_attempts: dict[tuple[str, str], dict[int, int]] = {}
        """Failure counts the store held past the cursor when the broker last started."""
        self.attempts_checked = 0
        """Sends after a restart judged against a stored count (the judge's reach)."""
        checker.attempts_judge = self

    def restarted(self) -> None:
        """The broker starts: what its restored subscriptions must count from."""
        metadata = self.broker.metadata
        self.stored_attempts = {}
        for topic, sub in self.judged:
            name = parse_topic(topic)
            cursor = metadata.get(keys.cursor(name, sub), -1)
            stored = metadata.get(keys.attempts(name, sub)) or ()
            counts = {o: f for o, f in stored if o > cursor}
            if counts:
                self.stored_attempts[(topic, sub)] = counts

    def sent(self, topic: str, sub: SubscriptionRecordView, offset: int) -> None:
        """Invariant 17: a stored count is never forgotten: the first send of the offset
        since the start counts at least the failures the store held."""
        stored = self.stored_attempts.get((topic, sub.name), {}).pop(offset, None)
        if stored is None or sub.dispatcher is None:
            return
        self.attempts_checked += 1
        counted = sub.dispatcher.attempts(offset)
        if counted < stored:
            self.checker._violate(
                POISON,
                f"{topic}/{sub.name}: offset {offset} sent after a restart counting {counted} "
                f"failure(s); the store held {stored}",
            )

    def set_policies(self) -> None:
        """Before the subscriptions exist: each takes the policy when it is created."""
        core = self.broker.core
        assert core is not None
        for topic, sub in self.judged:
            policy = failure_settings(self.poison, self.limit, topic)
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
                        self.stored_attempts.get((topic, sub), {}).pop(offset, None)
                    if step.value:
                        self.released += release
                        self.skipped += not release
                        self.world.log(
                            f"operator {'release' if release else 'skip'} {topic}/{sub} {offset}"
                        )
                    self.broker._apply(step.effects)
        self.world.at(SWEEP_US, self._sweep)

    def halted(self, topic: str) -> bool:
        """The topic, or under DeadLetter its dead-letter topic, stopped (damaged data
        waits for an operator): its poison can settle no more, and holds the rest back
        (Key-Shared: its key; the others: every new message), as a stopped topic would."""
        stopped = self.broker.stopped_topics
        return topic in stopped or (
            self.poison == "dead_letter" and dead_letter_topic(topic) in stopped
        )

    def settled(self) -> bool:
        return not any(self.checker.unsettled(t, s) for t, s in self.judged if not self.halted(t))

    def judge_end(self) -> None:
        """After the drain: every acknowledged message settled for every subscription."""
        for topic, sub in self.judged:
            if self.halted(topic):
                continue
            left = self.checker.unsettled(topic, sub)
            if left:
                self.checker._violate(
                    POISON,
                    f"{topic}/{sub}: {len(left)} acknowledged message(s) not acknowledged "
                    f"by a consumer, dead-lettered nor dropped by policy, e.g. "
                    f"{sorted(left)[:3]}",
                )

"""An operator changing subscriptions and policies while the load runs (`--operator P`): the
admin API's decisions (`BrokerCore.set_dispatch_window`, `set_failure_policy`,
`set_topic_policies`) applied to live subscriptions, under the same faults and invariants as
everything else. The broker's own answer to each change (effects, refusals) is what runs."""

from __future__ import annotations

from danube.machines.dispatch.reliable import Backoff
from danube.machines.node.settings import PoisonPolicy, SubscriptionFailureSettings
from danube.values.errors import DanubeError
from sim.broker import SimBroker
from sim.faults import Injected
from sim.poison import failure_settings as poison_settings
from sim.world import World

DISPATCH_RATES = (0, 300, 1000)
"""Messages a second; above the default workload's 200 a topic, so a paced subscription
still drains, though it falls behind in bursts."""


class Operator:
    def __init__(
        self,
        world: World,
        broker: SimBroker,
        injected: Injected,
        subscriptions: list[tuple[str, str]],
    ) -> None:
        self.world = world
        self.broker = broker
        self.injected = injected
        self.subscriptions = subscriptions
        self.poison: tuple[str, int] | None = None
        """The poison workload's policy and limit, which the operator's changes keep."""

    def act(self) -> None:
        """One change, chosen by the run's RNG; nothing while the broker is down."""
        core, rng = self.broker.core, self.world.rng
        if core is None or not self.subscriptions:
            return
        topic, sub = rng.choice(self.subscriptions)
        now = self.broker.now_ms
        choice = rng.randrange(3)
        try:
            if choice == 0:
                window = rng.randint(1, 20)
                step = core.set_dispatch_window(topic, sub, window, now_ms=now)
                what = f"window {window}"
            elif choice == 1:
                fields = dict(
                    ack_timeout_ms=rng.choice((200, 1_000, 30_000)),
                    base_redelivery_delay_ms=rng.choice((0, 50, 500)),
                    max_redelivery_delay_ms=5_000,
                )
                backoff = rng.choice((Backoff.FIXED, Backoff.EXPONENTIAL))
                if self.poison is not None:
                    policy = poison_settings(*self.poison, topic, backoff=backoff, **fields)
                else:
                    policy = SubscriptionFailureSettings(
                        **fields, backoff=backoff, poison_policy=PoisonPolicy.BLOCK
                    )
                step = core.set_failure_policy(topic, sub, policy, now_ms=now)
                what = f"ack timeout {policy.ack_timeout_ms}"
            else:
                rate = rng.choice(DISPATCH_RATES)
                step = core.set_topic_policies(topic, {"max_subscription_dispatch_rate": rate})
                what = f"dispatch rate {rate}"
        except DanubeError as refused:  # e.g. the topic is stopped: the change is refused
            self.world.log(f"operator {topic} {sub}: refused {refused.message}")
            return
        self.broker._apply(step.effects)
        self.injected[f"operator_{('window', 'failure_policy', 'dispatch_rate')[choice]}"] += 1
        self.world.log(f"operator {topic} {sub}: {what}")

"""Policy flags and their rendering, shared by `namespaces set-policies` and `topics
set-policies` (our PolicyAdmin extension: policies travel as a JSON object, 0 = unlimited)."""

from __future__ import annotations

import argparse
import json

from danube.cli.admin_args import count
from danube.cli.admin_call import AdminError, BadUsage
from danube.cli.admin_render import Result, table

POLICY_FIELDS = (
    ("max_producers_per_topic", "producers a topic accepts at once"),
    ("max_consumers_per_topic", "consumers a topic accepts at once"),
    ("max_subscriptions_per_topic", "subscriptions a topic may have"),
    ("max_consumers_per_subscription", "consumers one subscription accepts"),
    ("max_message_size", "largest payload in bytes"),
    ("max_publish_rate", "messages per second a topic accepts"),
    ("max_subscription_dispatch_rate", "messages per second sent to one subscription"),
)


def add_policy_flags(parser: argparse.ArgumentParser, *, namespace: bool = False) -> None:
    for name, meaning in POLICY_FIELDS:
        parser.add_argument(
            "--" + name.replace("_", "-"), dest=name, type=count, metavar="N",
            help=f"{meaning} (0: unlimited)",
        )  # fmt: skip
    if namespace:  # a namespace default only: a subscription sets its own policy
        parser.add_argument(
            "--failure-policy", dest="failure_policy", metavar="JSON",
            help="default failure policy of the namespace's reliable subscriptions that set "
            "none, as a JSON object of set-failure-policy's fields, e.g. "
            '\'{"max_redelivery_count": 3, "poison_policy": "drop"}\'; \'null\' clears it',
        )  # fmt: skip


def policy_changes(args: argparse.Namespace) -> str:
    """The fields given on the command line, as the JSON object PolicyAdmin takes."""
    changes = {name: getattr(args, name) for name, _ in POLICY_FIELDS}
    given: dict[str, object] = {n: value for n, value in changes.items() if value is not None}
    failure = getattr(args, "failure_policy", None)
    if failure is not None:
        try:
            given["failure_policy"] = json.loads(failure)
        except json.JSONDecodeError as error:
            raise BadUsage(f"--failure-policy is not JSON ({error})") from None
    if not given:
        flags = ", ".join("--" + name.replace("_", "-") for name, _ in POLICY_FIELDS)
        raise BadUsage(f"nothing to change: give at least one of {flags}")
    return json.dumps(given, sort_keys=True)


def parse_policies(what: str, text: str) -> dict[str, object]:
    try:
        found = json.loads(text or "{}")
    except json.JSONDecodeError as error:
        raise AdminError(f"{what}: the broker sent policies that are not JSON ({error})") from None
    if not isinstance(found, dict):
        raise AdminError(f"{what}: the broker sent policies that are not a JSON object")
    return found


def policies_result(
    what: str, text: str, overridden: list[str] | None = None, head: str = ""
) -> Result:
    """A policy per row; for a topic (`overridden` given) also where each value comes from."""
    policies = parse_policies(what, text)
    if overridden is None:
        rows: list[tuple[object, ...]] = [(k, _limit(v)) for k, v in sorted(policies.items())]
        body = table(("policy", "value"), rows, "no policies")
        data: dict[str, object] = dict(policies)
    else:
        rows = [
            (k, _limit(v), "topic" if k in overridden else "namespace")
            for k, v in sorted(policies.items())
        ]
        body = table(("policy", "value", "source"), rows, "no policies")
        data = {"policies": policies, "overridden": sorted(overridden)}
    return Result(data, f"{head}\n{body}" if head else body)


def _limit(value: object) -> object:
    return "unlimited" if value == 0 else value

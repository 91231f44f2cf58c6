"""Answers the generated code cannot decode. `danube_admin.BrokerLoadInfo` has a field named
`load`, which hides `betterproto.Message.load()`, the method parsing calls: decoding any
`ClusterBalanceResponse` with brokers in it fails. These mirrors have the same field numbers
and types (so the same wire format) with that one field renamed."""

from __future__ import annotations

from dataclasses import dataclass

import betterproto

from danube.proto import danube_admin as pb

BALANCE_ROUTE = "/danube_admin.BrokerAdmin/GetClusterBalance"


@dataclass(eq=False, repr=False)
class BrokerLoad(betterproto.Message):
    broker_id: int = betterproto.uint64_field(1)
    load_value: float = betterproto.double_field(2)
    topic_count: int = betterproto.uint32_field(3)
    is_overloaded: bool = betterproto.bool_field(4)
    is_underloaded: bool = betterproto.bool_field(5)


@dataclass(eq=False, repr=False)
class ClusterBalance(betterproto.Message):
    coefficient_of_variation: float = betterproto.double_field(1)
    mean_load: float = betterproto.double_field(2)
    max_load: float = betterproto.double_field(3)
    min_load: float = betterproto.double_field(4)
    std_deviation: float = betterproto.double_field(5)
    broker_count: int = betterproto.uint32_field(6)
    brokers: list[BrokerLoad] = betterproto.message_field(7)  # noqa: RUF009 (betterproto's way)
    assignment_strategy: str = betterproto.string_field(8)


async def cluster_balance(stub: pb.BrokerAdminStub, timeout_s: float) -> ClusterBalance:
    """BrokerAdmin/GetClusterBalance, decoded into the mirror."""
    request = pb.ClusterBalanceRequest()
    return await stub._unary_unary(BALANCE_ROUTE, request, ClusterBalance, timeout=timeout_s)


def balance_data(answer: ClusterBalance, plain: dict[str, object]) -> dict[str, object]:
    """The JSON of the answer with the proto's field name `load` back."""
    brokers = [
        {("load" if key == "load_value" else key): value for key, value in broker.items()}
        for broker in plain["brokers"]  # type: ignore[attr-defined]
    ]
    return {**plain, "brokers": brokers}

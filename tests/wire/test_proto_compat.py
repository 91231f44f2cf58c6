"""The generated types that needed a repair decode what they encode."""

from __future__ import annotations

import danube.proto_compat  # noqa: F401  (applies the repairs)
from danube.proto import danube_admin as admin_pb


def test_cluster_balance_with_brokers_round_trips() -> None:
    sent = admin_pb.ClusterBalanceResponse(
        coefficient_of_variation=0.5,
        broker_count=2,
        brokers=[
            admin_pb.BrokerLoadInfo(broker_id=7, load=3.5, topic_count=4, is_overloaded=True),
            admin_pb.BrokerLoadInfo(broker_id=9, load=0.0, topic_count=0, is_underloaded=True),
        ],
        assignment_strategy="Fair",
    )
    received = admin_pb.ClusterBalanceResponse().parse(bytes(sent))
    assert received == sent
    assert received.brokers[0].load == 3.5

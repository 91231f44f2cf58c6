"""Repairs to the generated wire types that the generated code cannot carry (it is never
edited by hand). Importing this module applies them; every module that decodes the
affected messages imports it."""

from __future__ import annotations

import io

import betterproto

from danube.proto import danube_admin as admin_pb


def _decodable_load_info() -> None:
    """`BrokerLoadInfo.load` (Danube's field name, kept for the wire and JSON) hides the
    `Message.load` that betterproto's `parse` calls, so a ClusterBalanceResponse listing
    brokers could not be decoded by anyone: not by a follower forwarding GetClusterBalance,
    nor by `danube-admin brokers balance`. This restores `parse` on the class."""

    def parse(self: admin_pb.BrokerLoadInfo, data: bytes) -> admin_pb.BrokerLoadInfo:
        return betterproto.Message.load(self, io.BytesIO(data))

    admin_pb.BrokerLoadInfo.parse = parse  # type: ignore[method-assign]


_decodable_load_info()

"""`danube_ext.ReplicationAdmin` (issue 27): a topic's replication as operators read it
(`danube-admin topics describe`). The live state is the owner's (its replication machine:
high watermark, each follower's acknowledged end); a broker that does not own the topic asks
the owner (its registered admin address, one hop: `grpc_util.FORWARDED`), and when the owner
cannot be reached answers from the recorded replica set alone (`live` false, `note` says why).
"""

from __future__ import annotations

import grpclib.const
from grpclib import GRPCError

from danube.machines.node.core import BrokerCore
from danube.proto import danube_ext as ext_pb
from danube.runtime.forwarding import forward
from danube.runtime.grpc_util import FORWARDED, unary
from danube.runtime.replication_metrics import follower_lag
from danube.runtime.replication_port import ReplicationPort
from danube.values.errors import DanubeError

PATH = "/danube_ext.ReplicationAdmin/TopicReplication"


class ReplicationAdminService:
    def __init__(self, core: BrokerCore, broker_id: str, port: ReplicationPort | None) -> None:
        self._core = core
        self._broker_id = broker_id
        self._port = port

    async def topic_replication(
        self, request: ext_pb.TopicReplicationRequest
    ) -> ext_pb.TopicReplicationResponse:
        name = request.name
        if self._core.serves(name):
            return self.live(name)
        port = self._port
        if port is None:
            return ext_pb.TopicReplicationResponse(
                name=name, note="standalone broker: topics are not replicated"
            )
        seen = port.records.get(name)
        if seen is None:
            return ext_pb.TopicReplicationResponse(name=name, note="no replica set recorded")
        record = seen[0]
        address = port.addresses.get(record.owner)
        why = f"the owner {record.owner} is not registered"
        if address is not None and record.owner != self._broker_id and not FORWARDED.get():
            try:
                return await forward(address, PATH, request, ext_pb.TopicReplicationResponse)
            except (DanubeError, GRPCError) as error:
                why = f"the owner {record.owner} did not answer: {error}"
        return ext_pb.TopicReplicationResponse(
            name=name,
            owner=record.owner,
            epoch=record.epoch,
            followers=[
                ext_pb.FollowerReplication(broker_id=f, in_sync=f in record.in_sync)
                for f in record.followers
            ],
            in_sync=list(record.in_sync),
            note=f"recorded replica set only ({why})",
        )

    def live(self, name: str) -> ext_pb.TopicReplicationResponse:
        """This broker owns the topic: its replication machine's view."""
        state = self._core.replication_state(name)
        if state is None:
            return ext_pb.TopicReplicationResponse(
                name=name, owner=self._broker_id, live=True, note="no followers"
            )
        lags = follower_lag(state)
        links = self._port.links if self._port is not None else None
        followers = [
            ext_pb.FollowerReplication(
                broker_id=follower,
                acknowledged=link["acknowledged"],
                sent=link["sent"],
                lag=lags[follower],
                in_sync=follower in state["in_sync"],
                connected=links is not None and links.connected(follower),
            )
            for follower, link in state["followers"].items()
        ]
        return ext_pb.TopicReplicationResponse(
            name=name,
            owner=self._broker_id,
            epoch=state["epoch"],
            high_watermark=state["high_watermark"],
            durable_end=state["durable_end"],
            followers=followers,
            in_sync=list(state["in_sync"]),
            live=True,
            note="deposed: a newer owner exists" if state["deposed"] else "",
        )

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            PATH: unary(
                self.topic_replication,
                ext_pb.TopicReplicationRequest,
                ext_pb.TopicReplicationResponse,
            )
        }

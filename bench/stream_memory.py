"""What an open gRPC stream and a client connection cost a real broker (issue 28, the soak's
state accounting): RSS deltas of a standalone `danube-broker` over N idle streams on one
connection, then C connections.

    PYTHONPATH=src:. python -m bench.stream_memory --streams 2000 --connections 300

`danube-cli load` (the soak's load) holds every producer's batch stream and every consumer's
receive stream on one connection: 2,000+ streams for 1,000 topics. `bench/state_memory.py`
measured topics with unbatched producers (no stream) and consumers each with one receive
stream, over a connection per 50 topics. Phases, each the broker's RSS after it less before,
divided by what it opened (after a warm-up of `--warm` of each, so that code paths and the
allocator's first arenas are not charged):

- batch stream: `PublishBatches` opened and left waiting for its first batch (the handler
  task, its answer-writer task, its queue, grpclib's stream, h2's stream state);
- receive stream: `ReceiveMessages` opened and left waiting for its request (the handler task,
  grpclib's and h2's stream state);
- connection: a client connection that made one call and stays open (the protocol, h2's
  connection state, its buffers, the guard's timers).

Each phase's streams or connections stay open until the end (nothing freed lends its room to
the next phase).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import grpclib.client
import grpclib.const

from bench.workload import rss_mib
from danube.localcluster.broker_process import BrokerProcess
from danube.proto import danube as pb

BATCHES = "/danube_ext.ProducerExt/PublishBatches"
RECEIVE = "/danube.ConsumerService/ReceiveMessages"
HEALTH = "/danube.HealthCheck/HealthCheck"


def _channel(broker: BrokerProcess) -> grpclib.client.Channel:
    host, port = broker.broker_addr.rsplit(":", 1)
    return grpclib.client.Channel(host, int(port))


async def _open_streams(
    channel: grpclib.client.Channel, path: str, count: int, stack: contextlib.AsyncExitStack
) -> None:
    """Opens `count` streams (headers only): each handler waits for its first message."""
    cardinality = (
        grpclib.const.Cardinality.STREAM_STREAM
        if path == BATCHES
        else grpclib.const.Cardinality.UNARY_STREAM
    )
    for _ in range(count):
        stream: Any = channel.request(path, cardinality, pb.ReceiveRequest, pb.StreamMessage)
        await stack.enter_async_context(stream)
        await stream.send_request()


async def _connect(broker: BrokerProcess, count: int, kept: list[grpclib.client.Channel]) -> None:
    for _ in range(count):
        channel = _channel(broker)
        await pb.HealthCheckStub(channel).health_check(pb.HealthCheckRequest(request_id=1, id=1))
        kept.append(channel)


def _settled_rss(pid: int) -> float:
    time.sleep(1.5)
    return rss_mib(pid)


async def run(args: argparse.Namespace) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="danube-streams-"))
    config = work / "broker.yaml"
    config.write_text("broker:\n  grpc:\n    max_concurrent_streams: 16384\n")
    broker = BrokerProcess(work / "data", config_file=config, log_file=work / "broker.log")
    broker.start()
    channels: list[grpclib.client.Channel] = []
    out: dict[str, float] = {}
    try:
        async with contextlib.AsyncExitStack() as stack:
            warm = _channel(broker)
            channels.append(warm)
            await _open_streams(warm, BATCHES, args.warm, stack)
            await _open_streams(warm, RECEIVE, args.warm, stack)
            await _connect(broker, args.warm // 10, channels)
            rss = [_settled_rss(broker.pid)]
            busy = _channel(broker)
            channels.append(busy)
            await _open_streams(busy, BATCHES, args.streams, stack)
            rss.append(_settled_rss(broker.pid))
            await _open_streams(busy, RECEIVE, args.streams, stack)
            rss.append(_settled_rss(broker.pid))
            await _connect(broker, args.connections, channels)
            rss.append(_settled_rss(broker.pid))
            mib = 2**20
            out = {
                "rss_after_warmup_mib": round(rss[0], 1),
                "batch_stream_bytes": round((rss[1] - rss[0]) * mib / args.streams),
                "receive_stream_bytes": round((rss[2] - rss[1]) * mib / args.streams),
                "connection_bytes": round((rss[3] - rss[2]) * mib / args.connections),
                "rss_end_mib": round(rss[3], 1),
            }
            for channel in channels:  # the streams end with their channels
                channel.close()
            stack.pop_all()
    finally:
        broker.kill()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=2_000)
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--warm", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=1))


if __name__ == "__main__":
    main()

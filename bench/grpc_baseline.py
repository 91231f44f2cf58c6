"""The floor under every per-message unary call: a grpclib server whose handler only answers,
hosted on plain asyncio and through trio-asyncio (as the broker is), called sequentially.

    .venv/bin/python -m bench.grpc_baseline --calls 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import time

import grpclib.const
import trio
import trio_asyncio
from grpclib.client import Channel
from grpclib.server import Server, Stream

from danube.proto import danube as pb


class _Answer:
    async def health_check(self, stream: Stream) -> None:
        await stream.recv_message()
        await stream.send_message(pb.HealthCheckResponse(status=0))

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            "/danube.HealthCheck/HealthCheck": grpclib.const.Handler(
                self.health_check,
                grpclib.const.Cardinality.UNARY_UNARY,
                pb.HealthCheckRequest,
                pb.HealthCheckResponse,
            )
        }


def _serve(flavour: str, port: int, seconds: float) -> None:
    async def on_asyncio() -> None:
        server = Server([_Answer()])
        await server.start("127.0.0.1", port)
        await asyncio.sleep(seconds)
        server.close()

    async def on_trio() -> None:
        async with trio_asyncio.open_loop():
            server = Server([_Answer()])
            await trio_asyncio.aio_as_trio(server.start)("127.0.0.1", port)
            await trio.sleep(seconds)
            server.close()

    if flavour == "asyncio":
        asyncio.run(on_asyncio())
    else:
        trio.run(on_trio)


async def _measure(port: int, calls: int) -> float:
    channel = Channel("127.0.0.1", port)
    stub = pb.HealthCheckStub(channel)
    for attempt in range(100):
        try:
            await stub.health_check(pb.HealthCheckRequest())
            break
        except OSError:
            await asyncio.sleep(0.05 * (attempt + 1))
    started = time.perf_counter()
    for _ in range(calls):
        await stub.health_check(pb.HealthCheckRequest())
    elapsed = time.perf_counter() - started
    channel.close()
    return elapsed * 1000 / calls


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    result = {}
    for flavour in ("asyncio", "trio-asyncio"):
        port = _free_port()
        server = multiprocessing.Process(target=_serve, args=(flavour, port, 60.0), daemon=True)
        server.start()
        try:
            result[f"{flavour}_ms_per_call"] = asyncio.run(_measure(port, args.calls))
        finally:
            server.terminate()
            server.join()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

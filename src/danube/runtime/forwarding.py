"""One admin call asked again of another broker's admin port: the topic's owner, or the
cluster's leader (spec/cluster.md, "Administration"). Every forwarding broker goes through
here, so all of them read admin addresses, time out and report a silent peer the same way.

A forwarded call carries `x-danube-forwarded`, and a broker never forwards a call that reached
it forwarded (`grpc_util.unary` records the header in `FORWARDED`): two brokers whose views disagree
about who owns or leads, for the moment a change takes to show, answer UNAVAILABLE at once
instead of passing the call between them until its deadline.
"""

from __future__ import annotations

import logging
import time
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpclib.const
from grpclib import GRPCError

from danube.client.errors import TRANSPORT_ERRORS
from danube.runtime.grpc_util import FORWARDED, FORWARDED_HEADER
from danube.runtime.peers import PEERS
from danube.values.errors import DanubeError, ErrorCode, quoted

log = logging.getLogger("danube.runtime")

R = TypeVar("R")

DEFAULT_TIMEOUT_S = 10.0


def host_port(address: str, what: str = "admin") -> tuple[str, int]:
    """`host:port` (or a URL) of another broker's port; UNAVAILABLE naming `what` when it
    is not one (replication_link reads follower addresses with it too)."""
    split = urlsplit(address if "//" in address else f"http://{address}")
    try:
        port = split.port
    except ValueError:
        port = None
    if split.hostname is None or port is None:
        raise DanubeError(ErrorCode.UNAVAILABLE, f"unusable {what} address {quoted(address)}")
    return split.hostname, port


async def forward(
    admin_url: str,
    path: str,
    request: Any,
    reply_type: type[R],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> R:
    """The answer of the broker at `admin_url` to `request` on `path` (asyncio, as grpclib
    is). Its GRPCError is passed on unchanged; a broker that cannot be reached or does not
    answer in `timeout` seconds is UNAVAILABLE, naming the address."""
    if FORWARDED.get():
        raise DanubeError(
            ErrorCode.UNAVAILABLE,
            f"another broker sent this call here, but this broker sees {admin_url} as the "
            "owner/leader: views are changing; retry",
        )
    host, port = host_port(admin_url)
    channel = PEERS.channel(host, port)
    started = time.monotonic()
    try:
        async with channel.request(
            path, grpclib.const.Cardinality.UNARY_UNARY, type(request), reply_type,
            timeout=timeout, metadata={FORWARDED_HEADER: "1", **PEERS.metadata()},
        ) as stream:  # fmt: skip
            await stream.send_message(request, end=True)
            reply = await stream.recv_message()
    except GRPCError:
        raise
    except (*TRANSPORT_ERRORS, TimeoutError) as error:
        raise DanubeError(
            ErrorCode.UNAVAILABLE,
            f"the broker at {admin_url} did not answer ({error or type(error).__name__})",
        ) from None
    finally:
        channel.close()
    if reply is None:
        raise DanubeError(ErrorCode.UNAVAILABLE, f"the broker at {admin_url} answered nothing")
    log.info(
        "event=admin_forwarded path=%s to=%s seconds=%.3f",
        path, admin_url, time.monotonic() - started,
    )  # fmt: skip
    return reply

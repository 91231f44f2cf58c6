"""Which schema registry calls each port serves (spec/protocol.md, "Ports").

Both ports serve `danube_schema.SchemaRegistry`, as Danube does. What a producer does with the
registry stays on the client port: registering a version (checked against the subject's
compatibility mode), reading schemas, versions, subjects and a topic's binding, checking
compatibility. Calls that change the rules other parties rely on are operator calls, served on
the admin port only: a topic's binding and validation policy (ConfigureTopicSchema,
UpdateTopicValidationPolicy), a subject's compatibility mode (SetCompatibilityMode: `none`
lets any version in) and its history (DeleteSchemaVersion). Until the client port
authenticates its callers (issue 16) it cannot tell an operator from any producer, so it
refuses them with PERMISSION_DENIED, naming the admin port.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import grpclib.const
import grpclib.server
from grpclib import GRPCError
from grpclib.const import Status

SERVICE = "/danube_schema.SchemaRegistry/"
ADMIN_ONLY = {
    "ConfigureTopicSchema": "danube-admin topics configure-schema",
    "UpdateTopicValidationPolicy": "danube-admin topics set-validation-policy",
    "SetCompatibilityMode": "danube-admin schemas set-compatibility",
    "DeleteSchemaVersion": "danube-admin schemas delete",
}
"""SchemaRegistry methods refused on the client port, with the command that makes the call on
the admin port."""


class Mapped(Protocol):
    def __mapping__(self) -> dict[str, grpclib.const.Handler]: ...


def refusal(method: str) -> str:
    """The status message of an admin-only call on the client port."""
    return (
        f"SchemaRegistry/{method} changes a topic's schema binding or a subject's rules: an "
        f"operator call, served on the broker's admin port (e.g. {ADMIN_ONLY[method]}), "
        "not on the client port"
    )


class ClientPortSchemaRegistry:
    """The registry as the client port serves it: every call of `registry` except ADMIN_ONLY,
    which answer PERMISSION_DENIED without reading the request."""

    def __init__(self, registry: Mapped) -> None:
        self._registry = registry

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        routes = dict(self._registry.__mapping__())
        for method in ADMIN_ONLY:
            path = SERVICE + method
            routes[path] = routes[path]._replace(func=_refuse(method))
        return routes


def _refuse(method: str) -> Callable[[grpclib.server.Stream], Awaitable[None]]:
    message = refusal(method)

    async def refuse(_: grpclib.server.Stream) -> None:
        raise GRPCError(Status.PERMISSION_DENIED, message)

    return refuse

"""Danube's `SecurityAdmin` service on the admin port (reference §1.11): roles and bindings
stored in the metadata store under `/auth/` (`danube.machines.security.records` checks and
spells them). Each write also refreshes the broker's own RBAC at once (`AuthGuard.rbac`), as
Danube's brokers update their cache eagerly. The calls themselves need ManageCluster
(`danube.runtime.auth`, the default rule).

In a cluster every broker follows `/auth/` in etcd (`follow`, a read plus a watch): a write
on any broker is in force on every broker as soon as the watch delivers it (milliseconds; the
tests ask for a second). The broker that took the write answers once its own watch has
applied it, so the caller's next call, on this broker, is decided with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpclib.const

from danube.machines.security import records
from danube.machines.security.rbac import Rbac
from danube.metadata import MetadataStore, WatchEvent
from danube.proto import danube_admin as pb
from danube.runtime.grpc_util import unary
from danube.runtime.watching import follow, store_call_from_grpc
from danube.values.errors import DanubeError, ErrorCode, quoted

SERVICE = "/danube_admin.SecurityAdmin/"
OWN_WRITE_WAIT_S = 1.0
"""How long a write waits for this broker's watch to apply it before answering anyway."""


def _role(value: dict[str, Any]) -> pb.RoleDefinition:
    return pb.RoleDefinition(
        name=value["name"], permissions=list(value["permissions"]), system=bool(value["system"])
    )


def _binding(value: dict[str, Any]) -> pb.BindingDefinition:
    return pb.BindingDefinition(
        id=value["id"],
        principal_type=value["principal_type"],
        principal_name=value["principal_name"],
        role_names=list(value["role_names"]),
        scope=value["scope"],
        resource_name=value["resource_name"],
    )


class SecurityAdminService:
    def __init__(
        self, store: MetadataStore, base: Rbac, on_change: Callable[[Rbac], None] | None
    ) -> None:
        self._store = store
        self._base = base
        self._on_change = on_change
        self._started = 0
        self._applied = 0
        """Re-reads after writes, numbered in the order they start: each starts after its
        write is stored, so a later one sees every earlier write, and a result that arrives
        after a later one was applied is older and dropped (a revocation cannot be undone by
        a slow re-read of the state before it)."""
        self._view: records.AuthView | None = None
        """Cluster mode: what this broker's watch of `/auth/` has applied (`follow`)."""

    async def load(self) -> Rbac:
        """The RBAC in force: the configuration's plus what is stored (called at start)."""
        entries = {kv.key: kv.value for kv in await self._store.scan(records.AUTH_PREFIX)}
        return records.rbac_from(entries, self._base)

    async def follow(self) -> None:
        """Cluster mode (trio): every change under `/auth/`, from any broker, replaces this
        broker's RBAC as the watch delivers it. Runs for the broker's life."""
        view = self._view = records.AuthView()

        def publish() -> None:
            if self._on_change is not None:
                self._on_change(records.rbac_from(view.entries, self._base))

        async def read() -> int:
            found = await self._store.scan(records.AUTH_PREFIX)
            seen = view.load((kv.key, kv.value, kv.mod_revision) for kv in found)
            publish()
            return seen

        def on_event(event: WatchEvent) -> None:
            if view.apply(event.kind, event.key, event.value, event.mod_revision):
                publish()

        await follow(self._store, records.AUTH_PREFIX, read, on_event)

    async def _changed(self, revision: int = 0, gone: str | None = None) -> None:
        """After a write (its revision) or a delete (the key `gone`): this broker's RBAC
        includes it when this returns (or a second passed, in a cluster)."""
        if self._on_change is None:
            return
        view = self._view
        if view is not None:  # cluster: the watch applies it, in revision order
            deadline = time.monotonic() + OWN_WRITE_WAIT_S
            while (view.revision < revision or gone in view.entries) and (
                time.monotonic() < deadline
            ):
                await asyncio.sleep(0.005)
            return
        self._started += 1
        ticket = self._started
        entries = await store_call_from_grpc(self._store.scan, records.AUTH_PREFIX)
        if ticket < self._applied:
            return
        self._applied = ticket
        self._on_change(records.rbac_from({kv.key: kv.value for kv in entries}, self._base))

    async def _get(self, key: str, what: str) -> dict[str, Any]:
        kv = await store_call_from_grpc(self._store.get, key)
        if kv is None or not isinstance(kv.value, dict):
            raise DanubeError(ErrorCode.NOT_FOUND, f"{what} not found")
        return kv.value

    async def _scan(self, prefix: str) -> list[dict[str, Any]]:
        found = await store_call_from_grpc(self._store.scan, prefix)
        return [kv.value for kv in found if isinstance(kv.value, dict)]

    # -- roles ---------------------------------------------------------------------------

    async def create_role(self, request: pb.CreateRoleRequest) -> pb.CreateRoleResponse:
        definition = request.role
        value = records.role(definition.name, definition.permissions, definition.system)
        revision = await store_call_from_grpc(
            self._store.put, records.role_key(definition.name), value
        )
        await self._changed(revision)
        return pb.CreateRoleResponse(success=True)

    async def get_role(self, request: pb.GetRoleRequest) -> pb.GetRoleResponse:
        value = await self._get(records.role_key(request.name), f"role {quoted(request.name)}")
        return pb.GetRoleResponse(role=_role(value))

    async def list_roles(self, _: pb.Empty) -> pb.ListRolesResponse:
        return pb.ListRolesResponse(
            roles=[_role(v) for v in await self._scan(records.ROLES_PREFIX)]
        )

    async def delete_role(self, request: pb.DeleteRoleRequest) -> pb.DeleteRoleResponse:
        key = records.role_key(request.name)
        records.undeletable(await self._get(key, f"role {quoted(request.name)}"))
        await store_call_from_grpc(self._store.delete, key)
        await self._changed(gone=key)
        return pb.DeleteRoleResponse(success=True)

    # -- bindings ------------------------------------------------------------------------

    async def create_binding(self, request: pb.CreateBindingRequest) -> pb.CreateBindingResponse:
        b = request.binding
        value = records.binding(
            b.id, b.principal_type, b.principal_name, b.role_names, b.scope, b.resource_name
        )
        key = records.binding_key(records.scope_of(b.scope), b.resource_name, b.id)
        await self._changed(await store_call_from_grpc(self._store.put, key, value))
        return pb.CreateBindingResponse(success=True)

    def _binding_key(self, scope: str, resource: str, binding_id: str) -> str:
        return records.binding_key(records.scope_of(scope), resource, binding_id)

    async def get_binding(self, request: pb.GetBindingRequest) -> pb.GetBindingResponse:
        key = self._binding_key(request.scope, request.resource_name, request.binding_id)
        value = await self._get(key, f"binding {quoted(request.binding_id)}")
        return pb.GetBindingResponse(binding=_binding(value))

    async def list_bindings(self, request: pb.ListBindingsRequest) -> pb.ListBindingsResponse:
        scope = records.scope_of(request.scope)
        resource = records.resource_key(scope, request.resource_name)
        found = [
            v
            for v in await self._scan(records.BINDINGS_PREFIX)
            if v.get("scope") == scope.value and v.get("resource_name") == resource
        ]
        return pb.ListBindingsResponse(bindings=[_binding(v) for v in found])

    async def list_all_bindings(self, _: pb.Empty) -> pb.ListBindingsResponse:
        found = await self._scan(records.BINDINGS_PREFIX)
        return pb.ListBindingsResponse(bindings=[_binding(v) for v in found])

    async def delete_binding(self, request: pb.DeleteBindingRequest) -> pb.DeleteBindingResponse:
        key = self._binding_key(request.scope, request.resource_name, request.binding_id)
        await self._get(key, f"binding {quoted(request.binding_id)}")
        await store_call_from_grpc(self._store.delete, key)
        await self._changed(gone=key)
        return pb.DeleteBindingResponse(success=True)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        rpcs: list[tuple[str, Any, type, type]] = [
            ("CreateRole", self.create_role, pb.CreateRoleRequest, pb.CreateRoleResponse),
            ("GetRole", self.get_role, pb.GetRoleRequest, pb.GetRoleResponse),
            ("ListRoles", self.list_roles, pb.Empty, pb.ListRolesResponse),
            ("DeleteRole", self.delete_role, pb.DeleteRoleRequest, pb.DeleteRoleResponse),
            ("CreateBinding", self.create_binding, pb.CreateBindingRequest,
             pb.CreateBindingResponse),
            ("GetBinding", self.get_binding, pb.GetBindingRequest, pb.GetBindingResponse),
            ("ListBindings", self.list_bindings, pb.ListBindingsRequest,
             pb.ListBindingsResponse),
            ("ListAllBindings", self.list_all_bindings, pb.Empty, pb.ListBindingsResponse),
            ("DeleteBinding", self.delete_binding, pb.DeleteBindingRequest,
             pb.DeleteBindingResponse),
        ]  # fmt: skip
        return {SERVICE + name: unary(call, req, rep) for name, call, req, rep in rpcs}

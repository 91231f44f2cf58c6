"""What every format's compatibility rules report, and how the modes combine them.

Each format answers one question, `can_read(reader, writer)`: can a consumer holding the
`reader` schema read every message written with the `writer` schema? The modes are built
from it (Confluent's definitions): BACKWARD — the new schema reads data written with the
old (`can_read(new, old)`); FORWARD — the old reads the new (`can_read(old, new)`); FULL —
both. Plain modes compare with the latest version, TRANSITIVE ones with every version."""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Incompatibility:
    """One reason a reader cannot read a writer's data. `path` locates it in the schema
    (`/fields/address/fields/zip`, `#/properties/age`, `orders.Order.items`), so a user
    can find what to change; `message` says what is wrong in words."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class CompatibilityMode(enum.Enum):
    NONE = "none"
    BACKWARD = "backward"
    BACKWARD_TRANSITIVE = "backward_transitive"
    FORWARD = "forward"
    FORWARD_TRANSITIVE = "forward_transitive"
    FULL = "full"
    FULL_TRANSITIVE = "full_transitive"

    @property
    def transitive(self) -> bool:
        return self.value.endswith("_transitive")

    @property
    def backward(self) -> bool:
        return self.value.startswith(("backward", "full"))

    @property
    def forward(self) -> bool:
        return self.value.startswith(("forward", "full"))

"""`fast_init`: a frozen, slotted dataclass built at the cost of a plain one.

A frozen dataclass's generated `__init__` sets each field through `object.__setattr__(self,
name, value)` (its own `__setattr__` refuses), a generic attribute store that looks the name
up in the class on every call: about three times the cost of a plain class's `self.x = x`.
Effects, steps, index entries and metadata values are frozen and built on every request, so a
simulated cluster run spent about a tenth of its time in these constructors. With `slots=True`
each field has a member descriptor; calling its `__set__` directly stores the value as cheaply
as a plain class does and, like the generated code, is not stopped by the frozen
`__setattr__`. Nothing else changes: the signature (defaults, factories, keyword-only fields),
`__post_init__`, equality, hashing, `replace` and the refusal of later assignments are the
dataclass's own.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

T = TypeVar("T", bound=type)

_FACTORY = dataclasses._HAS_DEFAULT_FACTORY  # type: ignore[attr-defined]
"""The default dataclasses give a parameter whose field has a `default_factory`."""


def fast_init(cls: T) -> T:
    """Gives the frozen, slotted dataclass `cls` an `__init__` with the same signature and
    effect that stores each field through its slot's descriptor. Any other class, or one whose
    `__init__` takes `InitVar`s, is returned as it is."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        return cls
    fields = dataclasses.fields(cls)
    signature = inspect.signature(cls.__init__)
    names = {f.name for f in fields}
    if any(name not in names for name in list(signature.parameters)[1:]):
        return cls  # an InitVar: left to the dataclass's own code
    space: dict[str, Any] = {"_FACTORY": _FACTORY}
    args, body, keyword_only = ["self"], [], False
    for param in list(signature.parameters.values())[1:]:
        if param.kind is inspect.Parameter.KEYWORD_ONLY and not keyword_only:
            args.append("*")
            keyword_only = True
        if param.default is inspect.Parameter.empty:
            args.append(param.name)
        else:
            space[f"_default_{param.name}"] = param.default
            args.append(f"{param.name}=_default_{param.name}")
    for f in fields:
        space[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        factory = f.default_factory is not dataclasses.MISSING
        if factory:
            space[f"_factory_{f.name}"] = f.default_factory
        if f.init:
            value = (
                f"_factory_{f.name}() if {f.name} is _FACTORY else {f.name}" if factory else f.name
            )
        elif factory:
            value = f"_factory_{f.name}()"
        elif f.default is not dataclasses.MISSING:
            space[f"_value_{f.name}"] = f.default
            value = f"_value_{f.name}"
        else:
            continue
        body.append(f"    _set_{f.name}(self, {value})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = f"def __init__({', '.join(args)}) -> None:\n" + ("\n".join(body) or "    pass")
    exec(source, space)
    init = space["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[misc]
    return cls

"""Swarm testing (`--swarm`), as FoundationDB's and TigerBeetle's simulators do it: each seed
also draws which faults and workload features are on, so combinations that one fixed profile
almost never reaches (a fault alone, without the others that mask it; one consumer, one key,
`flush` durability with synced writes...) come up in some seeds.

Why a separate RNG: the draw comes from `random.Random(f"swarm-{kind}-{seed}")`, not from the
world's, so the swarm machinery never moves a world draw. A swarm run of seed N is exactly the
plain run of seed N with the drawn settings, and its replay command spells those settings out
(`--profile none` and every knob that differs from the defaults): a human reads what was on,
and the replay reproduces the digest without `--swarm`.

Each fault of the chosen profile (knobs given on the command line are pinned, not drawn) is on
with probability one half; an "on" fault keeps its probability, or half or twice of it. Each
workload feature is drawn within ranges the checker judges soundly (`flush` durability is
judged as spec/durability.md says; tiered-only knobs only in tiered runs). Every draw happens
whether or not its knob is pinned, so pinning one knob never changes another's draw."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

W = TypeVar("W")
F = TypeVar("F")

ON = 0.5
"""Chance that a fault or an on/off workload feature is on in a seed."""
SCALES = (0.5, 1.0, 1.0, 2.0)
"""What an "on" fault's probability is multiplied by: mostly the profile's own."""

Space = Mapping[str, Callable[[random.Random, Any], Any]]
"""Per workload knob: how a seed draws its value (from the swarm RNG and the base value)."""


def swarm_rng(kind: str, seed: int) -> random.Random:
    """The swarm's own RNG for one seed of one simulator (`broker`, `cluster`, `schemas`).
    Seeding with a string hashes it with SHA-512: the same on every run and platform."""
    return random.Random(f"swarm-{kind}-{seed}")


@dataclass(frozen=True, slots=True)
class Draw(Generic[W, F]):
    """One seed's settings and what the swarm turned on and off."""

    seed: int
    workload: W
    faults: F
    faults_on: tuple[str, ...]
    faults_off: tuple[str, ...]
    drawn: tuple[tuple[str, Any], ...]
    """The workload knobs the swarm drew, with their values (pinned ones left out)."""

    def features(self) -> list[str]:
        """What was on, for counting over seeds: each fault on, each on/off workload feature
        that is on (a true boolean, a non-zero chance or period), `knob:item` for each item of
        a set (`subscriptions:shared`), `knob=value` for the rest."""
        shown = list(self.faults_on)
        for name, value in self.drawn:
            if isinstance(value, bool) or name in _OFF_AT_ZERO:
                if value:
                    shown.append(name)
            elif isinstance(value, tuple):
                shown.extend(f"{name}:{item}" for item in value)
            else:
                shown.append(f"{name}={_spelled(value)}")
        return shown

    def line(self) -> str:
        """The report line: `swarm: faults on ...; off ...; workload k v, ...`."""
        on = ", ".join(self.faults_on) or "none"
        off = ", ".join(self.faults_off) or "none"
        drawn = ", ".join(f"{name} {_spelled(value)}" for name, value in self.drawn) or "none"
        return f"  swarm: faults on {on}; off {off}; workload {drawn}"

    def summary(self) -> dict[str, Any]:
        """For `--json`: the same, as data."""
        return {
            "faults_on": list(self.faults_on),
            "faults_off": list(self.faults_off),
            "workload": {name: _spelled(value) for name, value in self.drawn},
        }


_OFF_AT_ZERO = frozenset(
    {
        "nack",
        "batched",
        "operator",
        "history_every_ms",
        "admin",
        "rebind",
        "bad",
        "switch",
        "poison",
    }
)
"""Workload knobs whose 0 means the feature is off (a chance, a period, a count)."""


def _spelled(value: Any) -> Any:
    return ",".join(value) if isinstance(value, tuple) else value


def draw(
    kind: str,
    seed: int,
    workload: W,
    faults: F,
    space: Space,
    *,
    pinned: Iterable[str] = (),
    inert: Iterable[str] = (),
    unscaled: Iterable[str] = (),
) -> Draw[W, F]:
    """Seed `seed`'s swarm settings from `workload` and `faults` (the profile with the
    command line's knobs). `pinned`: knobs given on the command line, kept as given. `inert`:
    fault knobs that do nothing in this run (the object store's without a tier), left as they
    are and not reported. `unscaled`: fault knobs an "on" draw may lower but never raise."""
    rng = swarm_rng(kind, seed)
    pinned, inert, unscaled = set(pinned), set(inert), set(unscaled)
    fault_values: dict[str, Any] = {}
    on: list[str] = []
    off: list[str] = []
    for item in dataclasses.fields(faults):  # type: ignore[arg-type]
        # Drawn for every knob, whatever its value: a knob set to 0 on the command line or by
        # another profile does not move the draws of the knobs after it.
        lit, scale = rng.random() < ON, rng.choice(SCALES)
        value = getattr(faults, item.name)
        if not isinstance(value, float) or value <= 0 or item.name in pinned | inert:
            continue
        if not lit:
            off.append(item.name)
            fault_values[item.name] = 0.0
            continue
        if item.name in unscaled:
            scale = min(scale, 1.0)
        fault_values[item.name] = round(min(1.0, value * scale), 6)
        on.append(item.name)
    workload_values: dict[str, Any] = {}
    for name, choose in space.items():
        value = choose(rng, getattr(workload, name))
        if name not in pinned:
            workload_values[name] = value
    return Draw(
        seed=seed,
        workload=dataclasses.replace(workload, **workload_values),  # type: ignore[type-var]
        faults=dataclasses.replace(faults, **fault_values),  # type: ignore[type-var]
        faults_on=tuple(on),
        faults_off=tuple(off),
        drawn=tuple(workload_values.items()),
    )


def either(values: tuple[Any, ...], off: Any = 0.0) -> Callable[[random.Random, Any], Any]:
    """An on/off feature: off (`off`) half the time, else one of `values`."""
    return lambda rng, _: rng.choice(values) if rng.random() < ON else off


def one_of(*values: Any) -> Callable[[random.Random, Any], Any]:
    return lambda rng, _: rng.choice(values)


def coin(rng: random.Random, _: Any) -> bool:
    return rng.random() < ON


def subset(names: tuple[str, ...]) -> Callable[[random.Random, Any], tuple[str, ...]]:
    """A non-empty subset of `names`, in their order: each in with chance one half, and one
    drawn if none was."""

    def choose(rng: random.Random, _: Any) -> tuple[str, ...]:
        chosen = [name for name in names if rng.random() < ON]
        fallback = rng.choice(names)
        return tuple(chosen) if chosen else (fallback,)

    return choose


def given_knobs(argv: Iterable[str], *dataclasses_: type[Any]) -> set[str]:
    """The knobs of `dataclasses_` that `argv` sets (`--knob`, `--knob=v`, `--no-knob`):
    pinned under `--swarm`."""
    flags = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    given = set()
    for kind in dataclasses_:
        for item in dataclasses.fields(kind):
            flag = item.name.replace("_", "-")
            if f"--{flag}" in flags or f"--no-{flag}" in flags:
                given.add(item.name)
    return given


class Tally:
    """Which features the seeds of a multi-seed run had on, for its summary line: how often
    each was on among the failing seeds, against all seeds."""

    def __init__(self) -> None:
        self.seeds = 0
        self.failing = 0
        self.all: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()

    def add(self, swarm: Draw[Any, Any], ok: bool) -> None:
        features = swarm.features()
        self.seeds += 1
        self.all.update(features)
        if not ok:
            self.failing += 1
            self.failed.update(features)

    def line(self) -> str:
        if not self.failing:
            return f"swarm: no failing seed among {self.seeds}"
        shown = ", ".join(
            f"{name} {count}/{self.failing} (of {self.all[name]} seeds)"
            for name, count in self.failed.most_common()
        )
        return f"swarm: on in the {self.failing} failing seed(s): {shown}"

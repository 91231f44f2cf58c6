"""Whether a lookup, CreateProducer or Subscribe that finds its topic between owners is held
or answered (pure; spec/cluster.md, "Held answers").

During a failover a dead broker's producers and consumers ask the survivors again and again:
their topic is being assigned (the leader failed it over, the next owner is not chosen yet) or
is assigned to the broker asked and still loading there. Answered UNAVAILABLE at once, each
client sleeps its backoff, which by then has grown to a second or two (the official clients add
0.2 s a retry, up to 5 s), and learns that the topic is served only after that sleep: 1.5-2.6 s
of a 10 s lease's failover went on the clients' sleeps after the last load (bench/RESULTS.md,
issue 23 point 4). Held instead, the request is asked again as the view changes and answered
as soon as the topic has an owner (a lookup: the new owner's address) or is served here (a
create or subscribe: it succeeds), and UNAVAILABLE as before once `hold_ms` has passed
(`cluster.lookup_hold_ms`, 10 s).

Only what the broker's own view says is held (`placement.Settling`): asking again costs no
store read. The answer itself is decided again each time by the placement rules."""

from __future__ import annotations

from danube.machines.cluster.placement import Settling
from danube.values.errors import DanubeError

RECHECK_MS = 50
"""How often a held request asks again while it waits (the view and the core are in
memory: a check is a few dictionary reads)."""


MAX_HELD = 256
"""`cluster.lookup_hold_max`'s default: requests held at once on a broker. A failover of a
few hundred topics holds one request per producer and consumer of each; past the cap a
request is answered at once, as Danube does, so no number of clients can make held requests
cost the event loop more than this many rechecks every `RECHECK_MS`."""


def hold_until(
    error: DanubeError,
    asked_at_ms: int,
    now_ms: int,
    hold_ms: int,
    *,
    others_held: int,
    max_held: int,
) -> int | None:
    """When a request first asked at `asked_at_ms`, refused now with `error`, asks again
    (monotonic milliseconds); None: answer `error` now. Held: a topic between owners
    (`Settling`), while `hold_ms` has not passed since the request came (0: never held,
    Danube's behaviour) and fewer than `max_held` other requests are held on the broker
    (`others_held`, not counting this one: a request already held keeps its place)."""
    if hold_ms <= 0 or not isinstance(error, Settling):
        return None
    if others_held >= max_held:
        return None
    deadline = asked_at_ms + hold_ms
    if now_ms >= deadline:
        return None
    return min(deadline, now_ms + RECHECK_MS)

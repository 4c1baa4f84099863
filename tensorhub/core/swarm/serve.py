"""The serving side's decision for one chunk request, pure: what the node's peer handler
and the simulator both run.

A holder asked for a chunk answers one of five ways (:class:`Verdict`), in this order:

1. It lacks the chunk. If the chunk is on its way here, the request is *parked* until it
   is verified (or is not coming after all): "not yet" would only send the asker to
   retry. So is a request for one of a version's first chunks while our fetch of it has
   begun and holds nothing yet (``starting``): we ask for those first. Otherwise:
   NO_CHUNK. With ``cut_through`` a chunk whose bytes are *landing*
   here now is served as they land (the asker verifies the whole chunk against the
   manifest, as always), and a request for one asked for but not landing yet is parked
   until its bytes begin to land: a relay's next hop then trails its upstream by a
   piece, not by a whole chunk. A relay link that fell behind and moved to the chain's
   tail (``lagging``, see ChunkPlanner) parks nothing for a link that did not: BUSY,
   which moves its downstream on to the link before it (what it lacks reaches it only
   through that downstream now). An asker that fell behind too relays from it, the
   laggards chained behind the tail, and is parked for as any link is.
2. Its upload queue is full for this asker: BUSY (the asker tries another holder instead
   of holding one of its few request slots in our queue).
3. It is a super-seeding origin and this chunk already went out to someone who can pass
   it on: REDIRECT to them.
4. Else SERVE (and an origin records whom it sent the chunk to).

Who counts as "able to pass it on" depends on datacenters: :func:`seed_context` is the one
rule, fed by gossip's membership on the node and by the cluster model in the simulator.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from .seeding import SeedDecision


class Verdict(enum.Enum):
    SERVE = "serve"
    PARK = "park"
    NO_CHUNK = "no_chunk"
    BUSY = "busy"
    REDIRECT = "redirect"


@dataclass(frozen=True)
class ServeDecision:
    verdict: Verdict
    holders: tuple[str, ...] = ()
    """REDIRECT: the nodes the chunk went to (ask them)."""


def serve_decision(
    *,
    have: bool,
    incoming: bool,
    admit: Callable[[], bool],
    seed: Callable[[], SeedDecision] | None = None,
    cut_through: bool = False,
    landing: bool = False,
    lagging: bool = False,
    asker_lagging: bool = False,
    starting: bool = False,
) -> ServeDecision:
    """How to answer a request for a chunk of a version held here (see the module
    docstring). ``incoming``: we asked for the chunk; ``landing``: its bytes are arriving
    into our memory now (only read with ``cut_through``). ``admit`` and ``seed`` are asked
    only when the answer depends on them: ``admit`` counts refusals, and ``seed`` looks at
    the membership view. ``lagging``: we are a relay link that fell behind;
    ``asker_lagging``: so is the asker, which relays from us (ChunkPlanner._upstream).
    ``starting``: our fetch of the version began, we hold none of it yet, and the chunk is
    one of its first (``START_PARK_CHUNKS``), which we will ask for first. A chain forms
    link by link at the start of a fetch: each link's first requests reached its upstream
    before that upstream had asked its own (it had just begun, or its first ask had been
    answered "unknown version" by a link that began a moment later), were answered "no
    chunk", and were asked again 20-30 ms later. Every hop then added a chunk's time, not
    a piece's: an 8-link chain's tail got its first chunk 0.18 s after the head, 8 % of a
    256 MiB copy at 1 Gbit/s (bench/linerate.py --receivers 8, traced; session 49).
    Parked, the request is answered as the chunk's bytes begin to land here."""
    if not have and not (cut_through and landing):
        if lagging and not asker_lagging:
            return ServeDecision(Verdict.BUSY)
        return ServeDecision(Verdict.PARK if incoming or starting else Verdict.NO_CHUNK)
    if not admit():
        return ServeDecision(Verdict.BUSY)
    if seed is not None:
        d = seed()
        if not d.serve:
            return ServeDecision(Verdict.REDIRECT, d.holders)
    return ServeDecision(Verdict.SERVE)


@dataclass(frozen=True)
class SeedContext:
    """What a super-seeding origin needs to know about an asker (see SuperSeeder.decide)."""

    remote: bool
    """The asker is in another datacenter."""
    local_busy: bool
    """Our datacenter has other live members: they carry the version across the WAN."""
    can_pass_on: Callable[[str], bool] | None
    """Whether a node that got a chunk from us is alive and placed to pass it to the asker
    (None: nothing known)."""
    behind: Callable[[str], bool] | None = None
    """Whether a node that got a chunk from us is a relay link that fell behind, which
    passes nothing it lacks on to this asker (see :func:`past_laggards`; None: none is)."""


NO_CONTEXT = SeedContext(False, False, None)


def past_laggards(
    ctx: SeedContext, asker_lagging: bool, lagging: Callable[[str], bool]
) -> SeedContext:
    """``ctx`` where a relay link that fell behind (``lagging``: it relays from the
    chain's tail) cannot pass a chunk on to an asker that did not: it answers such an
    asker "busy" for every chunk it lacks (serve_decision), so sending the asker there
    stalls it until the laggard has the chunk. A chain head found slow (``headcheck``) was
    still receiving four chunks it had asked the origin for, and the origin sent the new
    head to it for each: the chain after it stalled and judged itself lagging in turn
    (bench/linerate.py --case slow --victim 1, 2 rounds of 5: 1.9-2.5x one copy)."""
    if asker_lagging:
        return ctx
    return SeedContext(ctx.remote, ctx.local_busy, ctx.can_pass_on, lagging)


START_PARK_CHUNKS = 8
"""A version's first chunks, which a fetch that began and holds nothing yet parks requests
for (``serve_decision``'s ``starting``): the chunks a relay's downstream asks its
upstream for first (``per_source`` of them, ``LAG_CHUNKS`` at most, ahead of what it
holds). Only those: a request for a later chunk of a link that holds nothing is a probe
for its news (``ChunkPlanner._start_news``), answered at once."""


def fetch_starting(chunk: int, *, fetching: bool, lagging: bool, have: bytearray) -> bool:
    """``serve_decision``'s ``starting``, for the node's replica and the simulated node
    alike: ``chunk`` is one of the version's first (``START_PARK_CHUNKS``), our fetch of it
    is under way (``fetching``), has not fallen behind (``lagging``: it parks nothing), and
    holds none of it yet (``have``: one byte per chunk; memchr, no Python loop)."""
    return chunk < START_PARK_CHUNKS and fetching and not lagging and have.find(1) < 0


def started_parks(parked: Iterable[int], landing: Callable[[int], bool]) -> list[int]:
    """The chunks whose parked requests are to be answered again once our fetch holds its
    first chunk (``fetch_starting`` no longer holds): those of the first chunks whose bytes
    are not landing here. A request parked only because we were starting waited on the
    promise that we would ask for its chunk first; once we hold a chunk the chain has
    formed and that promise is void. A fetch whose own first request for the chunk was
    lost (its source crashed) left it to a rack-mate that owns the chunk's way into the
    rack, and that rack-mate had asked *us* for it: each waited on the other for ever
    (simulated, elastic with preemptions, seed 298; the node would have waited out its
    request timeout). Answered again, a request we did ask for parks again (``incoming``);
    one we did not is told "no chunk" and looks elsewhere."""
    return sorted(c for c in parked if c < START_PARK_CHUNKS and not landing(c))


D = TypeVar("D", bound=Hashable)
"""A datacenter's name: the node's locality prefix, the simulator's index."""


def seed_context(
    my_dc: D,
    peer_dc: D | None,
    others_here: Callable[[], bool],
    dc_of: Callable[[str], D | None],
    alive: Callable[[str], bool],
) -> SeedContext:
    """The one rule for both shells. ``peer_dc``: the asker's datacenter (None: unknown);
    ``others_here``: whether our datacenter has other live members (asked only for a
    remote asker); ``dc_of``: a node's datacenter; ``alive``: the membership view.

    For an asker of our own datacenter, a recipient in another one would have to send the
    chunk back across the WAN: as good as gone. A remote asker is meant to get it from our
    datacenter's recipients: they carry it across."""
    remote = peer_dc is not None and peer_dc != my_dc
    local_busy = remote and others_here()
    if peer_dc is None:
        return SeedContext(remote, local_busy, alive)

    def can_pass_on(name: str) -> bool:
        where = dc_of(name)
        return alive(name) and (where is None or remote or where == peer_dc)

    return SeedContext(remote, local_busy, can_pass_on)

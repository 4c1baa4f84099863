"""ChunkPlanner: a fetcher's choice of chunk and source, BitTorrent-style and locality-aware.

Pure and deterministic (ticks and a seeded generator are inputs), so the simulator runs the
very planner that moves real bytes. Rules, in order:

1. **Locality.** A chunk is only requested from the nearest tier that holds it (same host <
   same rack < same datacenter < another datacenter). Nothing crosses a WAN that a neighbour
   already has. The *origin* (the publisher) ranks after every other holder in its
   datacenter, so that once a chunk is out, fetchers pass it among themselves and the
   publisher's egress stays near one model size (it super-seeds: see ``seeding``).
2. **Cross-DC striping.** A chunk that no one in our datacenter holds is fetched across the
   WAN by exactly one node of the datacenter: its rendezvous-hash owner. Everyone else
   waits for it to appear locally, so each chunk crosses the WAN about once per datacenter
   and the WAN work is spread over all fetchers. The candidates are the datacenter's live
   members (and its known fetchers of this version): membership is known long before a
   fetch starts, so nodes that all start at once agree from the first tick (who is
   fetching is learnt from gossip too late for that). If the owner has not produced the
   chunk within ``owner_timeout`` ticks (dead, stuck, or not fetching), the next candidate
   in the chunk's rendezvous order may fetch it, then the next: still one WAN copy at a
   time. An owner the holder view still lists (alive, fetching) is slow, not gone, and is
   waited for: over a shaped WAN, taking over from slow owners only doubled the WAN bytes.
3. **Rarest first** among eligible chunks (fewest holders), after ``initial_random`` random
   picks so a newcomer quickly has something to serve; ties break in a seeded random order.
4. **Flow control.** At most ``per_source`` requests in flight per source and ``total``
   per fetcher; the least-loaded eligible source gets the next request.
5. **Endgame.** Once every missing chunk is in flight, each gets up to ``endgame_copies``
   extra requests to other sources; when one copy arrives the rest are cancelled.
6. **Failures.** A source that sent a corrupt chunk gets a strike and is banned for
   ``ban_ticks`` (forever after ``max_strikes``); one that errored or timed out is skipped
   for ``backoff_ticks``. A source that lacks a chunk it was hinted to have (not verified
   yet, or a stale hint) is skipped *for that chunk* for ``missing_ticks``; one that refused
   (busy upload slots, or a super-seeding origin that already sent the chunk out) for
   ``refused_ticks``; one that does not hold the version at all (a stale hint) is skipped
   for ``gone_ticks``; either way the chunk goes back to the pool.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import xxhash

WAN_TIER = 3


class RandomLike(Protocol):
    def shuffle(self, x: list[int]) -> None: ...


@dataclass(frozen=True)
class PlannerConfig:
    per_source: int = 4
    total: int = 16
    initial_random: int = 4
    endgame_copies: int = 1
    owner_timeout: int = 40
    backoff_ticks: int = 10
    ban_ticks: int = 200
    max_strikes: int = 3
    missing_ticks: int = 2
    refused_ticks: int = 5
    gone_ticks: int = 50


class Failure:
    """Why a request failed: the planner's reaction differs."""

    ERROR = "error"  # timed out, connection trouble: back off the source
    CORRUPT = "corrupt"  # wrong digest: a strike against the source
    MISSING = "missing"  # the source lacks the chunk (yet): try it again later
    REFUSED = "refused"  # busy, or an origin that already sent it: ask others first
    GONE = "gone"  # the source does not hold the version at all: a stale hint


@dataclass
class SourceInfo:
    """What the holder view says about one source of this version."""

    tier: int
    chunks: set[int]
    origin: bool = False
    inflight: int = 0
    strikes: int = 0
    blocked_until: int = 0
    banned: bool = False
    seen_at: int = 0  # tick the holder view last listed it (it is alive)

    @property
    def rank(self) -> int:
        """Preference order (lower first): by tier; an origin after its whole datacenter."""
        return 2 * max(self.tier, 2 if self.origin else 0) + self.origin


class Request(NamedTuple):
    source: str
    chunk: int
    duplicate: bool  # an endgame copy: receive it into scratch memory, not the destination


def _weight(node: str, chunk: int) -> int:
    return xxhash.xxh64_intdigest(f"{node}\0{chunk}".encode())


def wan_owner(chunk: int, fetchers: Iterable[str]) -> str | None:
    """The node of a datacenter that fetches ``chunk`` across the WAN (rendezvous hashing:
    stable, spread evenly, and only the dead owner's chunks move when membership changes)."""
    return max(fetchers, key=lambda f: _weight(f, chunk), default=None)


def owner_order(chunk: int, candidates: Iterable[str]) -> list[str]:
    """Who may fetch ``chunk`` across the WAN, in turn (rendezvous weight order)."""
    return sorted(set(candidates), key=lambda f: (-_weight(f, chunk), f))


@dataclass
class _Chunk:
    requested: dict[str, bool] = field(default_factory=dict)  # source -> duplicate?


class ChunkPlanner:
    def __init__(
        self,
        me: str,
        num_chunks: int,
        rng: RandomLike,
        config: PlannerConfig | None = None,
        have: Iterable[int] = (),
    ) -> None:
        self.me = me
        self.cfg = config or PlannerConfig()
        self.num_chunks = num_chunks
        self.have = bytearray(num_chunks)
        for c in have:
            self.have[c] = 1
        self.sources: dict[str, SourceInfo] = {}
        self.dc_fetchers: list[str] = [me]
        self.dc_members: list[str] = []
        self._owners: dict[int, list[str]] = {}  # chunk -> its WAN owner order
        self.now = 0
        self._order = list(range(num_chunks))
        rng.shuffle(self._order)  # the seeded tie-break among equally rare chunks
        self._rank = {c: i for i, c in enumerate(self._order)}
        self._chunks: dict[int, _Chunk] = {}  # chunks in flight
        self._waiting: dict[int, int] = {}  # chunk -> tick it started waiting for its WAN owner
        self._blocked: dict[tuple[str, int], int] = {}  # (source, chunk) -> until tick
        self._picked = 0
        self.wan_requests = 0

    # -- inputs --------------------------------------------------------------------------------

    def tick(self) -> None:
        self.now += 1

    def set_source(
        self, name: str, tier: int, chunks: Iterable[int], *, origin: bool = False
    ) -> None:
        """A holder of this version (from the holder view); replaces what we knew of it,
        keeping chunks we were told of directly (redirects) that the view lags behind on."""
        if name == self.me:
            return
        src = self.sources.get(name)
        if src is None:
            self.sources[name] = SourceInfo(tier, set(chunks), origin, seen_at=self.now)
        else:
            src.tier, src.origin = tier, origin
            src.chunks.update(chunks)
            src.seen_at = self.now

    def add_chunk(self, name: str, chunk: int, tier: int | None = None) -> None:
        """A source has (or is about to have) ``chunk``: it announced it, or the origin
        said it sent the chunk there. An unknown source is added if its ``tier`` is given."""
        src = self.sources.get(name)
        if src is None and tier is not None and name != self.me:
            src = self.sources[name] = SourceInfo(tier, set())
        if src is not None:
            src.chunks.add(chunk)
            src.seen_at = self.now

    def seen(self, name: str) -> None:
        """The holder view lists ``name`` as alive now (without news of its chunks)."""
        src = self.sources.get(name)
        if src is not None:
            src.seen_at = self.now

    def remove_source(self, name: str) -> list[int]:
        """A holder left or died: its in-flight chunks go back to the pool."""
        self.sources.pop(name, None)
        lost = []
        for c, st in list(self._chunks.items()):
            if st.requested.pop(name, None) is not None:
                lost.append(c)
                if not st.requested:
                    del self._chunks[c]
        return lost

    def set_dc_fetchers(self, names: Iterable[str], members: Iterable[str] = ()) -> None:
        """Live nodes of our datacenter fetching this version (us included), and its other
        live members: the candidate WAN owners."""
        fetchers = sorted({*names, self.me})
        others = sorted(set(members) - set(fetchers))
        if fetchers != self.dc_fetchers or others != self.dc_members:
            self.dc_fetchers, self.dc_members = fetchers, others
            self._owners.clear()

    def received(self, chunk: int, source: str) -> list[Request]:
        """``chunk`` arrived verified from ``source``; returns duplicate requests to cancel."""
        self.have[chunk] = 1
        self._waiting.pop(chunk, None)
        st = self._chunks.pop(chunk, None)
        self._release(source)
        if st is None:
            return []
        cancels = []
        for other, dup in st.requested.items():
            if other != source:
                self._release(other)
                cancels.append(Request(other, chunk, dup))
        return cancels

    def failed(self, chunk: int, source: str, why: str = Failure.ERROR) -> None:
        """A request failed; ``why`` is a :class:`Failure` kind."""
        st = self._chunks.get(chunk)
        if st is not None:
            st.requested.pop(source, None)
            if not st.requested:
                del self._chunks[chunk]
        self._release(source)
        src = self.sources.get(source)
        if src is None:
            return
        if why == Failure.CORRUPT:
            src.strikes += 1
            src.banned = src.strikes >= self.cfg.max_strikes
            src.blocked_until = self.now + self.cfg.ban_ticks
        elif why == Failure.MISSING:
            self._blocked[(source, chunk)] = self.now + self.cfg.missing_ticks
        elif why == Failure.REFUSED:
            self._blocked[(source, chunk)] = self.now + self.cfg.refused_ticks
        elif why == Failure.GONE:
            src.blocked_until = self.now + self.cfg.gone_ticks
        else:
            src.blocked_until = self.now + self.cfg.backoff_ticks

    def _release(self, source: str) -> None:
        src = self.sources.get(source)
        if src is not None and src.inflight > 0:
            src.inflight -= 1

    # -- output --------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return all(self.have)

    @property
    def inflight(self) -> int:
        return sum(len(st.requested) for st in self._chunks.values())

    def missing(self) -> list[int]:
        return [c for c in range(self.num_chunks) if not self.have[c]]

    def _usable(self, src: SourceInfo) -> bool:
        return not src.banned and src.blocked_until <= self.now

    def next_requests(self) -> list[Request]:
        """New requests to send now, within every limit."""
        budget = self.cfg.total - self.inflight
        if budget <= 0:
            return []
        usable = {n: s for n, s in self.sources.items() if self._usable(s)}
        wanted = [c for c in self._order if not self.have[c] and c not in self._chunks]
        if not wanted:
            return self._endgame(usable, budget)
        holders: dict[int, list[str]] = {c: [] for c in wanted}
        blocked = self._blocked
        if blocked:
            for key in [k for k, until in blocked.items() if until <= self.now]:
                del blocked[key]
        for name, s in usable.items():
            for c in s.chunks:
                if c in holders and (name, c) not in blocked:
                    holders[c].append(name)
        if self._picked >= self.cfg.initial_random:  # rarest first; stable seeded tie-break
            wanted.sort(key=lambda c: (len(holders[c]), self._rank[c]))
        out: list[Request] = []
        for c in wanted:
            if len(out) >= budget:
                break
            cands = holders[c]
            if not cands:
                continue
            best = min(usable[n].rank for n in cands)
            wan = best >= 2 * WAN_TIER
            if wan and not self._may_cross_wan(c):
                continue
            src = self._least_loaded([n for n in cands if usable[n].rank == best], usable)
            if src is None:
                continue
            out.append(self._request(src, c, duplicate=False))
            if wan:
                self.wan_requests += 1
        return out

    def _may_cross_wan(self, chunk: int) -> bool:
        order = self._owners.get(chunk)
        if order is None:
            order = self._owners[chunk] = owner_order(chunk, [*self.dc_fetchers, *self.dc_members])
        turn = order.index(self.me)
        if turn == 0:
            return True
        since = self._waiting.setdefault(chunk, self.now)
        if self.now - since < turn * self.cfg.owner_timeout:
            return False
        # Our turn by the clock; but an owner ahead of us that the holder view still lists
        # (alive, fetching this version) will bring it, however slow its WAN: a second WAN
        # copy would only slow both down. Take over only from owners that died, failed us,
        # or are not fetching at all.
        return not any(
            (s := self.sources.get(ahead)) is not None
            and not s.banned
            and self.now - s.seen_at < self.cfg.owner_timeout
            for ahead in order[:turn]
        )

    def _least_loaded(self, names: list[str], usable: dict[str, SourceInfo]) -> str | None:
        free = [n for n in names if usable[n].inflight < self.cfg.per_source]
        return min(free, key=lambda n: (usable[n].inflight, n)) if free else None

    def _request(self, source: str, chunk: int, duplicate: bool) -> Request:
        st = self._chunks.setdefault(chunk, _Chunk())
        st.requested[source] = duplicate
        self.sources[source].inflight += 1
        self._picked += 1
        return Request(source, chunk, duplicate)

    def _endgame(self, usable: dict[str, SourceInfo], budget: int) -> list[Request]:
        out: list[Request] = []
        for c in self._order:
            if len(out) >= budget:
                break
            st = self._chunks.get(c)
            if self.have[c] or st is None or not st.requested:
                continue
            if len(st.requested) > self.cfg.endgame_copies:
                continue
            cands = [
                n
                for n, s in usable.items()
                if c in s.chunks and n not in st.requested and (n, c) not in self._blocked
            ]
            if not cands:
                continue
            best = min(usable[n].rank for n in cands)
            if best >= 2 * WAN_TIER:
                continue  # a duplicate never crosses the WAN: that is the traffic we save
            src = self._least_loaded([n for n in cands if usable[n].rank == best], usable)
            if src is not None:
                out.append(self._request(src, c, duplicate=True))
        return out

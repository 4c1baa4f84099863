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
   **Across racks** (``rack_owners``) the same rule holds one level down: a chunk that no
   one in our rack holds (only other racks or an origin do) is fetched into the rack by
   its rendezvous owner among our rack's fetchers, and the others take it from that
   owner. A ToR uplink is oversubscribed where a NIC is not; without owners each rack
   pulled about two copies of a broadcast through it instead of one (``python -m sim``).
   A chunk that a rack-mate holds but deferred (busy, not there yet) waits for that
   rack-mate, as one a datacenter peer deferred waits instead of crossing the WAN: it
   neither enters the rack a second time (when we own it) nor sleeps out the owner's turn.
3. **Rarest first** among eligible chunks (fewest holders), after ``initial_random`` random
   picks so a newcomer quickly has something to serve; ties break in a seeded random order.
4. **Flow control.** At most ``per_source`` requests in flight per source and ``total``
   per fetcher; the least-loaded eligible source gets the next request.
5. **Endgame.** Once every missing chunk is in flight and at most ``endgame_chunks`` are
   missing, each gets up to ``endgame_copies`` extra requests to other sources; when one
   copy arrives the rest are cancelled.
6. **Failures.** A source that sent a corrupt chunk gets a strike and is banned for
   ``ban_ticks`` (forever after ``max_strikes``); one that errored or timed out is skipped
   for ``backoff_ticks``. A source that lacks a chunk it was hinted to have (not verified
   yet, or a stale hint) loses that hint until it announces the chunk again, and is
   skipped *for that chunk* for ``missing_ticks`` even if a lagging view lists it; one
   that refused (busy upload slots, or a super-seeding origin that already sent the chunk
   out) for ``refused_ticks``; one that does not hold the version at all (a stale hint)
   is skipped for ``gone_ticks``; either way the chunk goes back to the pool.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import chain
from typing import Final, NamedTuple, Protocol

import xxhash

from ..gossip.holders import SAME_RACK
from .headcheck import HEAD_CHUNKS, HEAD_MIN_MISSING, HEAD_SETTLE, HEAD_WAIT, HeadCheck
from .pace import PaceWatch

WAN_TIER = 3
RACK_TIER = 2  # a holder in another rack of our datacenter
_NONE = 1 << 30  # "no rank": no holder of a chunk may be asked now
NEVER = 1 << 62
"""A tick no fetch reaches: what :meth:`ChunkPlanner.next_due` answers when nothing is due
(the simulator reads it to set no wake)."""
RELAY_PATIENCE = 3
"""Times a relay's upstream may say it lacks a chunk ahead of what it holds before the
chunk is left to the swarm (a live upstream gets it within a few ticks)."""
RELAY_STALL = 20
"""...and ticks since its run of chunks last grew: a link after a slow one (a receiver on a
half-rate NIC, or one sharing its upstream's uplink for a while) gains a chunk every 7
ticks at 1 Gbit/s, and three "not yet"s two ticks apart took it for stalled: its
downstream took the chunks from the swarm, from the chain's head, whose stream then
slowed the whole chain (simulated, a receiver joining halfway)."""
RELAY_WAIT = 50
"""Ticks a relay waits, as far ahead of its upstream as it may ask, for the upstream to gain
a chunk before the swarm fills in (an upstream that gains none that long has stalled)."""
RELAY_HOP_WAIT = 5
"""Ticks more a relay waits for an upstream that holds nothing yet, per link before us in
the chain: the first chunk reaches the k-th link only once it has passed k hops, each
trailing the one before by a piece or two, each a process on a busy host. Waiting
``RELAY_WAIT`` alone, the last four links of a 16-link chain at 250 Mbit/s gave up on
their upstreams half a second in and took their chunks from the publisher, which
redirected them: the chain came apart (bench/linerate.py, 2.2-3.3x one copy, where 8
links held at 1.03x)."""
RELAY_START_WAIT = 20
"""Ticks a relay waits for a link that answered it has not begun its fetch (fetches that
start together began up to 160 ms apart on bench/linerate.py's 9 processes); a member
that does not fetch at all costs its downstream this much once."""
RELAY_START_AHEAD = 2
"""Chunks the link before one that has not begun must hold for us to stop waiting for it
(``RELAY_START_WAIT``) and relay from that link instead. Fetches that start together begin
milliseconds apart: a link that took the one before a link that began 1 ms later shared
its uplink with that link for its first 4 chunks (bench/linerate.py, N=4 healthy: 1.10x
one copy in 2 rounds of 3). A link that has not begun while the one before it got this
far is late: waiting ``RELAY_START_WAIT`` for it cost every link after it 0.18 s
(bench/linerate.py --case late)."""
LAG_CHUNKS = 8
"""Chunks by which a relay link may fall further behind the link before it, while relaying
from it, before it counts as *lagging* and moves to the chain's tail: a chain runs at its
slowest link's pace, so one receiver on a half-rate NIC mid-chain held every link after
it to half rate (bench/linerate.py --case slow: 2.0x one copy). Each chunk of lag costs
every link after it that chunk at its rate, but a healthy link judged lagging costs
more: 4 (``relay:planner.lag_chunks=4``) took the slow case from 1.34x one copy to 1.27x
at 256 MiB, and in one healthy round of 13 (its nodes ran ``gc.freeze()``, an experiment
that changes no decision) six links judged themselves lagging within their first 77
chunks, five of them 0-3 chunks in, and all shared the tail's uplink: 4.4x
(docs/results.md, session 21). At least ``per_source``: a link that just moved on to a
new upstream shares that upstream's uplink with what its old downstream still has in
flight there, and falls behind by as much. A link knows its upstream's chunks at once
(it tells it of each), so the judgement is its own. Also how far behind us a link is no
upstream of ours (see ``_upstream``)."""
LAG_FALL = 4
"""Chunks by which a relay link must fall further behind its upstream within the upstream's
last ``LAG_WINDOW`` chunks before a look at whether it keeps falling behind begins (at
most ``PlannerConfig.lag_chunks``). A link at half rate falls 8 chunks in 16 and a
healthy one seldom 4, so each chunk less is half a chunk's time sooner for the links after
a slow one, which run at its pace until its verdict (bench/linerate.py --case slow, N=4,
256 MiB, traced in session 38: the link after it ends as many chunk times after the one
before it as it held fewer chunks at the verdict). 4 since session 38: a job's first step
1.161x one copy (median of 9 rounds, 1 over 1.2x) against 1.218x with 5 (6 over),
alternated in one batch; healthy N=8 1.094-1.106x against 1.106-1.128x, and 1 GiB
1.030-1.041x against 1.034-1.040x; simulated 1.117x against 1.146x. The price is on a
starved host: with a busy loop beside N=8's nine processes on two cores, a healthy link
judged itself lagging in 5 rounds of 8 against 1 (1.149x against 1.123x; the link then
relays from the tail, at line rate: no round came apart). Session 25 set 5 after a
healthy N=8 round on a loaded host judged five links lagging with 4; those rounds were
the bench's fault, fixed in session 26 (fetches begun on partial gossip views). A link
that moves to a new upstream shares that upstream's uplink with what its old downstream
still has in flight there (up to ``per_source``, 4) and may fall that far once; the look
that follows (``LAG_WATCH``) sees the gap stop growing. Until session 25 the fall was
``LAG_CHUNKS`` from the least lag since the link began relaying, for the whole fetch: a
link on a half-rate NIC was judged only 21 of its upstream's chunks in, and a healthy
link on a busy host, whose upstream's uplink idles a few milliseconds now and then,
added those up over a long fetch (a 1 GiB round judged r2 lagging at 80 % of the
model)."""
LAG_WINDOW = 16
"""Upstream chunks over which that fall is measured (``ChunkPlanner._least_lag``)."""
LAG_WATCH = 3
"""``RELAY_START_WAIT`` periods a link that fell ``LAG_CHUNKS`` behind is watched before a
gap that stopped growing counts as a stall rather than a slow link. With one period, a
link on a half-rate NIC mid-chain (bench/linerate.py --case slow) caught its upstream's
news between two bursts, took the gap for flat, and never judged itself lagging in one
round of four: the chain after it ran at half rate (2.05-2.25x one copy, where a round
that judged it at 13 chunks took 1.33x)."""
LAG_WATCH_CHUNKS = 5
"""Chunks the upstream must gain, as well as ``RELAY_START_WAIT`` ticks pass, for a look at
whether a link that fell ``LAG_CHUNKS`` behind keeps falling behind. In ticks alone the
look scaled with the NIC's rate: at 250 Mbit/s a 4 MiB chunk takes 13 ticks, a link at
half rate fell less than a chunk further behind in one look, was never judged lagging,
and the chain after it ran at its pace (simulated, bench/linerate.py --case slow at 250
Mbit/s: 2.03x one copy). 5 chunks take less than the 20 ticks at 1 Gbit/s and more: the
look there is as it was."""
SIDE_GAP = 5
"""Chunks by which our upstream's highest must trail that of the link it relays from
before we take lone chunks from that link too (``ChunkPlanner._side_feed``). The fall
that began a link's own look at whether it lags when side chunks were measured (session
37; ``LAG_FALL`` then): a healthy link trails its upstream by a piece, and a busy host's
stall of a few chunk times is not worth splitting that link's uplink for."""
SIDE_BEHIND = 2
"""Chunks of our upstream's run from the first that we may lack and still take side
chunks (``ChunkPlanner._side_feed``): its news of a chunk comes before the chunk's last
piece, and a link that cuts through trails by one."""
SIDE_WINDOW = 8
"""Chunks of the side link's over which our upstream must keep falling behind it for a
side feed (``ChunkPlanner._side_falling``): a link at half rate falls 4 in 8."""
SCAN_PATIENCE = 16
"""Candidates a call may find unservable in a row before it stops looking."""


class RandomLike(Protocol):
    def shuffle(self, x: list[int]) -> None: ...


@dataclass(frozen=True)
class PlannerConfig:
    per_source: int = 4
    total: int = 16
    initial_random: int = 4
    endgame_copies: int = 1
    endgame_chunks: int = 2
    """Endgame only once this few chunks are missing (and all of them in flight). With every
    missing chunk eligible as soon as all were in flight (16 requests of 4 MiB), a fetcher
    duplicated a quarter of a 256 MiB model: bench/linerate.py, 8 receivers on 1 Gbit/s
    NICs, 13.5-14.3 % duplicate bytes and the last receiver at 2.23-2.34x one copy; with
    the last 2 chunks, 2.9-3.1 % and 1.75-1.92x."""
    owner_timeout: int = 40
    rack_owners: bool = True
    relay: bool = False
    """Pipelined relay as the starting plan: our datacenter's fetchers, in name order after
    the origin, form a chain, and each asks only its upstream (the one before it), for
    chunks in index order, up to ``per_source`` ahead of what the upstream holds (the
    upstream parks those until it has them, so each link streams back to back). A chain
    is what fills N replicas in one copy's time on NIC-limited nodes (each NIC carries one
    model each way); the swarm is the repair: with no upstream we can ask (unknown, dead,
    backed off) the fetch runs as a swarm until there is one again. A version whose
    origins each hold a slice (``set_source(origin=True)`` with part of it) swarms from
    the first such origin heard of (``ChunkPlanner.relay``)."""
    relay_min_chunks: int = 16
    """``relay``: a version of fewer chunks swarms. A chain's gain is the swarm's waste over
    many chunks (a 4 MiB chunk is 34 ms at 1 Gbit/s); its costs are waits counted in
    ticks: a member before us that never fetches holds us ``RELAY_START_WAIT`` (200 ms)
    once, and on loopback an 8-chunk fetch took 0.21 s relayed where it takes a few tens
    of milliseconds swarming (tests/test_shaping.py). 16 chunks are 64 MiB at 4 MiB."""
    lag_chunks: int = LAG_CHUNKS
    """``relay``: how far a link may fall behind its upstream before it moves to the tail
    (at least ``per_source``; see ``LAG_CHUNKS``)."""
    head_check: bool = True
    """``relay``: the link after the chain's head checks whether the head is slower than
    the origin could feed it (``headcheck``). Costs a healthy chain about one chunk time;
    off (``node:planner.head_check=false``), a slow head holds every link to its pace."""
    lag_gives_back: bool = True
    """``relay``: a link that moves to the chain's tail (it judged itself lagging, or was
    told it is a slow head) takes back what it asked its upstream for, which the source
    then does not send (the node's ``Cancel``). Left asked, those chunks came at the slow
    link's pace and shared the upstream's uplink with the stream of the link that relays
    from it now (simulated, N=4, 256 MiB: a half-rate head 1.19x one copy, a half-rate
    third link 1.21x; given back, 1.13x and 1.15x)."""
    head_chunks: int = HEAD_CHUNKS
    """``head_check``: how many of the head's chunks are timed before the probe (see
    ``HEAD_CHUNKS``; ``node:planner.head_chunks=8`` is the rule of session 28)."""
    lag_memory: bool = True
    """``relay``: links that lagged in their last fetch of the key begin this one at the
    chain's tail (:meth:`ChunkPlanner.set_lagged_before`). Off
    (``node:planner.lag_memory=false``), each fetch judges them afresh, as until session
    32."""
    pace_verdict: bool = True
    """``relay``: a link that fell ``LAG_FALL`` behind its upstream is judged lagging at
    once, without waiting for the look to end, if its own chunks came steadily slower than
    the upstream gained its own (``pace``). On since session 50: a job's first step with a
    half-rate link (bench/linerate.py --receivers 8 --case slow --steps 2), both settings
    in every round, took 1.150x one copy with it against 1.226x without (22 rounds, lower
    in 21), and no round with it judged a healthy link (one without it did, by the look,
    on a busy host: 1.61x); healthy N=8 took 1.114x against 1.113x (9 rounds), N=4 with
    a half-rate link 1.124x against 1.152x (2). Off from session 48 to 50 after false
    verdicts with it on; sessions 49 and 50 traced each to a cause now fixed (a tail
    passed over as not begun, a bench step begun on partial gossip views, a hole in a
    link's view of its new upstream's chunks: ``received``, ``PeerHandler._tell_held``;
    docs/results.md). ``node:planner.pace_verdict=false`` runs the look alone."""
    side_chunks: bool = False
    """``relay``: the link after one that keeps falling behind its own upstream takes lone
    chunks from that upstream meanwhile (``ChunkPlanner._side_feed``). Off by default:
    a link on a half-rate NIC gains (bench/linerate.py --case slow, a job's first step:
    1.174x one copy against 1.222x, 36 rounds each), but on a host whose cores are the
    limit a healthy link falls behind now and then while it keeps gaining, the side
    chunks taken from its upstream's uplink slow it further, and it and the links after
    it judged themselves lagging (N=8 healthy at 1 GiB: 1.22x-1.73x one copy in 4 rounds,
    1.05x-1.09x without; docs/results.md, session 37).
    ``node:planner.side_chunks=true`` runs it."""
    backoff_ticks: int = 10
    ban_ticks: int = 200
    max_strikes: int = 3
    missing_ticks: int = 2
    refused_ticks: int = 5
    gone_ticks: int = 50
    timeout_ticks: int = 300
    """A source that let a request time out (alive to TCP, yet sending nothing: a hung
    process) gets no new request for this long, so a stalled holder of our rack cannot
    draw the requests of the whole fetch back to it every backoff."""
    member_grace: int = 100
    """For this many ticks after a fetch begins, our datacenter's live members that are not
    known to fetch count as candidate WAN owners too: fetchers that start together learn
    of each other by gossip late, and with fetchers alone each believed itself the owner
    of everything (3.6 model sizes crossed per remote datacenter). After it, only known
    fetchers count: a member that does not fetch would hold each chunk it owns up for
    ``owner_timeout`` (with members for good, the simulated cross-DC step's remote stall
    was 2.58x its lower bound instead of 1.38x). Long enough for gossip to show who
    fetches: in the node a tick is 10 ms, so 1 s."""

    def __reduce__(self) -> tuple[type[PlannerConfig], tuple[int | bool, ...]]:
        """Rebuilt from its fields. The simulator's process pool sends scenarios, which
        hold one, to its workers; compiled by mypyc (``sim/native.py``) a frozen dataclass
        has no ``__dict__`` to restore and refuses to be set field by field."""
        return (PlannerConfig, tuple(getattr(self, f) for f in self.__dataclass_fields__))


class Passed:
    """Why a relay passed over a link before it on its way to the chain's head
    (``ChunkPlanner._passed_over``); the values name it in a trace."""

    LAGGARD: Final = "laggard"  # we lag, and so does it: not ahead of us, so to the tail
    LOST: Final = "lost"  # we lost it, and the view lists it with nothing gained since
    BEHIND: Final = "behind"  # far behind us: it joined late, or moved to the tail
    STARTING: Final = "starting"  # it said it has not begun: waited for a while
    NOT_BEGUN: Final = "not begun"  # ...and it still holds nothing, past the wait
    BLOCKED: Final = "blocked"  # backed off or banned


class Failure:
    """Why a request failed: the planner's reaction differs. (``Final``: read through the
    class, which mypyc's compiled planner requires, ``sim/native.py``.)"""

    ERROR: Final = "error"  # timed out, connection trouble: back off the source
    CORRUPT: Final = "corrupt"  # wrong digest: a strike against the source
    MISSING: Final = "missing"  # the source lacks the chunk (yet): try it again later
    REFUSED: Final = "refused"  # busy, or an origin that already sent it: ask others first
    GONE: Final = "gone"  # the source does not hold the version at all: a stale hint
    TIMEOUT: Final = "timeout"  # a request sat unanswered: the source hangs; leave it alone a while


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
    seen_at: int = 0  # tick it was last heard of as alive (ChunkPlanner._seen: or listed)
    top: int = -1
    """Relay: how far ahead it is. The highest chunk it was said to hold that is not held
    alone past a gap (its predecessor is held too, or it is chunk 0): a single chunk far
    ahead (a head check's probe, see ``headcheck``) is not how far its run got. Counted
    with the probe, the link after a slow link's upstream seemed 50 chunks ahead from the
    start, the gap never grew, and the slow link was never judged lagging (simulated,
    bench/linerate.py --case slow --victim 3: 2.0x one copy)."""
    rank: int = field(init=False, default=0)
    """Preference order (lower first): by tier; an origin after its whole datacenter. A
    field, not a property: every planning call reads it for every source (13.7 M reads in
    a 4,096-GPU simulation), and only ``place`` changes what it derives from."""

    def __post_init__(self) -> None:
        self.place(self.tier, self.origin)

    def place(self, tier: int, origin: bool) -> None:
        self.tier, self.origin = tier, origin
        self.rank = 2 * max(tier, 2 if origin else 0) + origin

    def gained(self, c: int) -> None:
        """``c`` was added to ``chunks``: ``top`` follows (O(1) as chunks come in order)."""
        chunks = self.chunks
        if c > 0 and c - 1 not in chunks:
            c += 1  # held alone, unless its successor was: that one has a predecessor now
            if c not in chunks:
                return
        while c + 1 in chunks:
            c += 1
        self.top = max(self.top, c)


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


@dataclass(frozen=True)
class DcView:
    """A datacenter's fetchers of a version and its other live members, each sorted and
    without repeats, none in both: the candidate WAN owners (:meth:`ChunkPlanner.set_dc_view`)."""

    fetchers: tuple[str, ...]
    others: tuple[str, ...]

    @classmethod
    def of(cls, fetchers: Iterable[str], members: Iterable[str] = ()) -> DcView:
        """The view of ``fetchers`` and ``members`` in any order (members that fetch are
        fetchers). Sorted and without repeats as sorted(set(...)) would be, but in O(n)
        when they come sorted (Timsort on a sorted run; sorting sets was a sixth of a
        10,000-GPU simulation)."""
        ours = tuple(dict.fromkeys(sorted(fetchers)))
        taken = set(ours)
        return cls(ours, tuple(m for m in dict.fromkeys(sorted(members)) if m not in taken))


class ChunkPlanner:
    """Incremental: what a call to :meth:`next_requests` looks at is bounded by what it
    hands out, not by the size of the version. Chunks that may be requested sit in buckets
    by availability (how many known sources hold them), each bucket ordered by the chunk's
    seeded rank; chunks in flight leave the buckets; chunks waiting for their WAN owner
    *sleep* until their turn or until a holder in our datacenter appears. (A version of
    35,000 chunks cost 119 ms per completed chunk when every call rebuilt the rarity order.)
    """

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
        self._missing = num_chunks - sum(self.have)
        self.sources: dict[str, SourceInfo] = {}
        self.dc_fetchers: Sequence[str] = (me,)
        self.dc_members: Sequence[str] = ()
        self._owners: dict[int, list[str]] = {}  # chunk -> its WAN owner order
        self._began: int | None = None  # the tick of the first next_requests call
        self._rack: list[str] | None = None  # our rack's fetchers (None: to be derived)
        self._rack_stale = False  # the fetchers changed since (:meth:`_refresh_rack`)
        self._near: list[str] | None = None  # our sources in our rack (None: to be derived)
        self._listed = -1  # the tick of the last seen_all_but: every source then but ...
        self._unlisted: frozenset[str] = frozenset()  # ... these was seen (see _seen)
        self._rack_owners: dict[int, list[str]] = {}  # chunk -> its rack owner order
        self.now = 0
        self._order = list(range(num_chunks))
        rng.shuffle(self._order)  # the seeded tie-break among equally rare chunks
        self._rank = [0] * num_chunks
        for i, c in enumerate(self._order):
            self._rank[c] = i
        self._holders: list[set[str]] = [set() for _ in range(num_chunks)]
        self._full: set[str] = set()
        """Sources holding every chunk, kept out of ``_holders`` (disjoint from every set
        there): announcing a full holder, the common case, is then O(1) in the version's
        size, not 35,000 bucket moves (0.2 s). A chunk's availability is its partial
        holders plus ``len(_full)``; the full part is the same for every chunk, so the
        buckets are keyed by the partial count alone and rarity order is unchanged."""
        self._buckets: dict[int, list[int]] = {}
        """Partial availability -> the negated ranks of its chunks, ascending: the next
        candidate is at the end, where taking it out moves nothing (at the front, each
        request moved the rest of a 35,000-chunk list: 10 us of a 46 us call)."""
        self._bucketed = bytearray(num_chunks)
        self._asleep: dict[int, int] = {}  # chunk -> tick it wakes (waiting for its WAN owner)
        self._alarms: list[tuple[int, int]] = []  # heap of (tick, chunk)
        self._chunks: dict[int, _Chunk] = {}  # chunks in flight
        self._waiting: dict[int, int] = {}  # chunk -> tick it started waiting for its WAN owner
        self._rack_waiting: dict[int, int] = {}  # the same, for its rack owner
        self._blocked: dict[tuple[str, int], int] = {}  # (source, chunk) -> until tick
        self._picked = 0
        self.relay = self.cfg.relay and num_chunks >= self.cfg.relay_min_chunks
        """This fetch runs ``cfg.relay``'s chain (if the version has ``relay_min_chunks``):
        until an origin holding only part of the version is heard of (see
        :meth:`set_source`); from then on it swarms."""
        self._relay_from = 0  # no chunk below this is missing (relay's scan starts here)
        self._relay_up: str | None = None  # our upstream when we last asked it
        self._relay_frontier = -1  # its run of chunks (_prefix) at its last "not held"
        self._relay_moved = 0  # the tick that run was first seen
        self._relay_misses: Counter[int] = Counter()  # chunk -> "not held" from it
        self._relay_holes: set[int] = set()  # chunks left to the swarm (it may never have them)
        self._relay_src: SourceInfo | None = None  # whose run of chunks _relay_prefix is
        self._relay_prefix = 0
        self._relay_asked: set[str] = set()  # links we asked for a chunk (they tell us news)
        self._start_news_from: str | None = None  # see _start_news
        self._start_news_asked: set[str] = set()
        self._unstarted: dict[str, int] = {}  # relay links not fetching yet: since when
        self._not_begun: set[str] = set()  # links that said "unknown version", holding none
        self._relay_redirected: set[int] = set()  # chunks our upstream sent us elsewhere for
        # (the upstream, its run of chunks, the tick we began to wait on it there)
        self._relay_waits: tuple[SourceInfo | None, int, int] = (None, -1, 0)
        self._assumed: set[str] = set()  # members relay took for links before they held any
        self._removed: dict[str, int] = {}  # relay: sources lost or dead -> the tick
        self._lost_at: dict[str, int] = {}  # relay: links lost -> their highest chunk then
        self._relay_hops = 0  # relay: links before us in the chain, at the last look
        self._lagging: set[str] = set()  # links (us, perhaps) that fell behind: the tail's
        self._lagged_before: frozenset[str] = frozenset()  # see set_lagged_before
        self._relay_since = 0  # the tick we began to relay from our upstream
        self._lag_window: deque[tuple[int, int]] = deque()  # (its chunks, our lag) lately
        self._relay_skipped = False  # our upstream is not the link just before us
        self._relay_before: list[str] = []  # the links before us, nearest first (_upstream)
        self._side_pair: tuple[str, str] | None = None  # (upstream, its upstream) watched
        self._side_gaps: deque[tuple[int, int]] = deque()  # (its top, our upstream's gap)
        self._lag_seen: tuple[int, int, int] | None = None  # (tick, lag, its chunks) then
        self._gap_seen: int | None = None  # our lag at the last look (_note_lag)
        self._stall_gap: int | None = None  # ... before we stalled (see stalled)
        self._taken_back: list[Request] = []  # requests to a laggard, for the session to end
        self._head = HeadCheck(self.cfg.head_chunks)  # relay: is the head slow? (headcheck)
        self._pace = PaceWatch()  # relay: is our own stream steadily slow? (pace)
        self._behind: list[str] = []  # heads found slow, for the session to tell
        self._kept: dict[str, int] | None = None
        """The usable sources' ranks (:meth:`_usable_ranks`), kept between calls: after a
        peer's announcement nothing about the sources changed, and rebuilding it walked
        every source the holder view lists on every call. None: rebuild it (a source came,
        went, moved, or was backed off); also rebuilt at ``_kept_until``, the first tick
        a backed-off source may be asked again. Callers only read it."""
        self._room: set[str] = set()  # of those, the ones below ``per_source`` in flight
        self._nearest_of: dict[int, tuple[int, tuple[str, ...]]] = {}
        """Chunk -> its best usable rank and the holders at that rank it is not blocked at
        (:meth:`_nearest`), for the usable ranks ``_nearest_for``: dropped for a chunk when
        its holders or blocks change, and whole when the ranks are rebuilt or a source
        becomes (or stops being) a full holder. A scan looks at up to ``SCAN_PATIENCE``
        candidates, most of whose nearest holders are busy: passing over every holder of
        each was 13 % of a 10,240-GPU simulation."""
        self._nearest_for: dict[str, int] | None = None
        self._kept_until = 0
        self._changes = 0
        """Bumped by every input that may change what a scan finds (:meth:`next_requests`)."""
        self._effects = 0  # bumped by what a scan changes itself (a chunk put to sleep, ...)
        self._quiet: tuple[int, int] | None = None
        """(changes, due) of the last call that found nothing and changed nothing: until an
        input moves ``changes`` or the clock reaches ``due``, another call would find
        nothing too. A peer's news of a chunk we have changes nothing to ask for; in a
        2,048-GPU simulation a third of the calls followed such news, each a futile scan
        of up to ``SCAN_PATIENCE`` candidates. ``due`` is the first tick at which an
        answer that call read from the clock would change (:meth:`_before`): a node's
        fetch loop calls every tick, and between chunks (three ticks apart at 1 Gbit/s)
        none of those calls asked for anything, yet each planned afresh because the tick
        had moved (bench/linerate.py, session 43: 490-570 futile calls a fetch)."""
        self._due = NEVER
        """The least tick a comparison with the clock noted in the call under way."""
        self.wan_requests = 0
        for c in range(num_chunks):
            if not self.have[c]:
                self._bucket(c)

    # -- the pool of requestable chunks ----------------------------------------------------

    def _bucket(self, c: int) -> None:
        if not self._bucketed[c]:
            insort(self._buckets.setdefault(len(self._holders[c]), []), -self._rank[c])
            self._bucketed[c] = 1

    def _unbucket(self, c: int) -> None:
        if self._bucketed[c]:
            ranks = self._buckets[len(self._holders[c])]
            del ranks[bisect_left(ranks, -self._rank[c])]
            self._bucketed[c] = 0

    def _holders_of(self, c: int) -> Iterable[str]:
        """Every source known to hold ``c`` (partial holders, then full ones)."""
        return chain(self._holders[c], self._full) if self._full else self._holders[c]

    def _hold(self, name: str, c: int) -> None:
        """``name`` holds chunk ``c``: its availability rises; a local holder wakes it."""
        if name in self._holders[c] or name in self._full:
            return
        was = self._bucketed[c]
        self._unbucket(c)
        self._holders[c].add(name)
        self._nearest_of.pop(c, None)
        if was:
            self._bucket(c)
        if c in self._asleep and self.sources[name].rank < self._wake_below(c):
            del self._asleep[c]  # a new holder to ask; or no crossing needed any more
            self._return(c)

    def _gain(self, name: str, src: SourceInfo, c: int) -> None:
        """``name`` (``src``) holds ``c``, which we did not know of: its chunks, its run
        (``top``) and the chunk's holders follow (the holder view, a peer's news, or the
        chunk it sent us)."""
        src.chunks.add(c)
        src.gained(c)
        self._hold(name, c)

    def _wake_below(self, c: int) -> int:
        """A new holder of ``c`` wakes it if it ranks below this: any holder, unless ``c``
        waits for an owner to bring it into our rack (then a rack-mate) or datacenter."""
        if c in self._rack_waiting:
            return 2 * RACK_TIER
        if c in self._waiting:
            return 2 * WAN_TIER
        return 1 << 30

    def _drop(self, name: str, c: int) -> None:
        if name in self._full:
            self._demote(name)
        self._unhold(name, c)

    def _unhold(self, name: str, c: int) -> None:
        if name not in self._holders[c]:
            return
        was = self._bucketed[c]
        self._unbucket(c)
        self._holders[c].discard(name)
        self._nearest_of.pop(c, None)
        if was:
            self._bucket(c)

    def _promote(self, name: str, src: SourceInfo) -> None:
        """``name`` now holds every chunk: move it from the per-chunk sets to ``_full``, at
        the cost of the smaller side: what it was known to hold, or what it was not."""
        known = src.chunks
        if 2 * len(known) <= self.num_chunks:  # e.g. a new source: nothing to undo
            for c in known:
                self._unhold(name, c)
            for c in list(self._asleep):  # as _hold would for each new chunk: one to ask
                if c not in known and src.rank < self._wake_below(c):
                    del self._asleep[c]
                    self._return(c)
        else:  # e.g. a fetcher that just completed: add the few it lacked, then shift
            for c in range(self.num_chunks):
                if c not in known:
                    self._hold(name, c)
            for held in self._holders:
                held.discard(name)
            # It held every chunk: each bucketed chunk's partial count drops by one alike.
            self._buckets = {k - 1: ranks for k, ranks in self._buckets.items()}
        src.chunks = set(range(self.num_chunks))
        src.top = self.num_chunks - 1
        self._full.add(name)
        self._nearest_of.clear()

    def _demote(self, name: str) -> None:
        """A full source lost a chunk (or its hint was wrong): back into the per-chunk sets,
        every bucketed chunk's partial count up by one alike; the caller then drops one."""
        self._full.discard(name)
        self._nearest_of.clear()
        for held in self._holders:
            held.add(name)
        self._buckets = {k + 1: ranks for k, ranks in self._buckets.items()}

    def _return(self, c: int) -> None:
        """Back to the pool, unless had, in flight or asleep."""
        if not self.have[c] and c not in self._chunks and c not in self._asleep:
            self._bucket(c)

    def _sleep(self, c: int, until: int) -> None:
        if self._rack_stale and self._rack is not None and c in self._rack_waiting:
            self._refresh_rack()  # (wakes nothing: no chunk sleeps on a rack owner yet)
        self._effects += 1
        self._unbucket(c)
        self._asleep[c] = until
        heappush(self._alarms, (until, c))

    # -- inputs --------------------------------------------------------------------------------

    def tick(self) -> None:
        self.now += 1
        grace_ends = self._began is not None and self.now == self._began + self.cfg.member_grace
        if grace_ends and self.dc_members:
            self._changes += 1
            self._reorder()  # members that are not fetching are no longer owners
        while self._alarms and self._alarms[0][0] <= self.now:
            until, c = heappop(self._alarms)
            if self._asleep.get(c) == until:
                self._changes += 1  # (a chunk back in the pool: a call may ask for it)
                del self._asleep[c]
                self._return(c)

    def set_source(
        self,
        name: str,
        tier: int,
        chunks: Iterable[int] | None,
        *,
        origin: bool = False,
        lagging: bool = False,
    ) -> None:
        """A holder of this version (from the holder view); replaces what we knew of it,
        keeping chunks we were told of directly (redirects) that the view lags behind on.
        ``chunks`` None (or ``range(num_chunks)``): it holds them all, which costs O(1) once
        it is known as such. ``lagging``: a relay link that fell behind (relay: it is the
        tail's, and a laggard's upstream; see _upstream). Once lagging, a link stays so
        for this fetch (as it does itself)."""
        if name == self.me:
            return
        self._changes += 1
        if lagging and name not in self._lagging:
            self._effects += 1
            self._lagging.add(name)
        self._not_begun.discard(name)  # (the view lists it: it began)
        full = chunks is None or (isinstance(chunks, range) and chunks == range(self.num_chunks))
        if origin and not full and self.relay and 0 < len(set(chunks or ())) < self.num_chunks:
            # A version sliced across origins (each trainer rank publishing its part): a
            # chain draws from one origin and would leave the others' slices to repair,
            # chunk by chunk. The swarm draws from all of them at once.
            self.relay = False
            self._effects += 1
        src = self.sources.get(name)
        if src is None:
            src = self.sources[name] = SourceInfo(tier, set(), origin, seen_at=self.now)
            self._rack = self._near = None
            self._kept = None
        else:
            if src.tier != tier:
                self._rack = self._near = None
            if (src.tier, src.origin) != (tier, origin):
                self._kept = None  # its rank moved
            src.place(tier, origin)
            src.seen_at = self.now
        if full:
            if name not in self._full:
                self._promote(name, src)
            return
        assert chunks is not None
        for c in set(chunks) - src.chunks if name not in self._full else ():
            self._gain(name, src, c)

    def set_lagged_before(self, names: Iterable[str]) -> None:
        """``relay``: links (us, perhaps) that fell behind in their last fetch of this key
        (the holder view's lag memory, ``HolderView.lagged``): they begin at the chain's
        tail, in name order. In RL the same workers fetch every step and a slow NIC stays
        slow, so without the memory every step paid for the verdict again: the links after
        a half-rate one relayed at its pace until it judged itself lagging, then ramped up
        on a connection to the link before it (bench/linerate.py --case slow: 1.25-1.40x
        one copy, session 31). At the tail such a link holds no one back, and one no longer
        slow costs nothing there: it relays from the last link at line rate, and its fetch
        ends without a verdict, which clears its memory for the next step. Unlike a lag
        judged in this fetch it changes nothing but the chain's order: such a link is
        judged as any other (its verdict is what the memory keeps), parks requests, and is
        not skipped as an upstream by a laggard. Given at the fetch's start; every fetcher
        reads the same memory from gossip, written when the last step ended, so they agree
        on the order from the first plan."""
        hinted = frozenset(names) if self.cfg.lag_memory else frozenset()
        if hinted != self._lagged_before:
            self._changes += 1
            self._effects += 1
            self._lagged_before = hinted

    def add_chunk(self, name: str, chunk: int, tier: int | None = None) -> None:
        """A source has (or is about to have) ``chunk``: it announced it, or the origin
        said it sent the chunk there. An unknown source is added if its ``tier`` is given."""
        src = self.sources.get(name)
        if src is None and tier is not None and name != self.me:
            src = self.sources[name] = SourceInfo(tier, set())
            self._rack = self._near = None
            self._kept = None
        if src is not None:
            # News of a chunk we have changes no scan, unless it is the source's first, or
            # alive news (an owner's turn reads it; a relay has none), or relay reads how
            # far the source got; nor does news we had (a repeat: the simulator's hints).
            fresh = chunk not in src.chunks
            if not src.chunks:
                self._changes += 1
            elif self.relay:
                if fresh and (not self.have[chunk] or self._reads_reach(name, src)):
                    self._changes += 1
            elif (fresh and not self.have[chunk]) or self._seen(name, src) != self.now:
                self._changes += 1
            src.seen_at = self.now
            if chunk not in src.chunks:
                self._gain(name, src, chunk)

    def add_chunks(self, name: str, chunks: Iterable[int]) -> None:
        """A known source holds ``chunks``: :meth:`add_chunk` for each we did not know of, in
        order. A link's first ``Have`` to a new asker lists every chunk it held
        (``PeerHandler._tell_held``), most of them known from gossip already; taken one by
        one, half of a 35,000-chunk version cost the asker 0.1 s of its event loop, at the
        moment it moved to that link."""
        src = self.sources.get(name)
        listed = list(chunks)
        if src is None or not listed:
            return
        # (a Have of chunks we knew of is still news that the source is alive: add_chunk
        # marks it seen)
        for c in sorted(set(listed) - src.chunks) or listed[:1]:
            self.add_chunk(name, c)

    def _reads_reach(self, name: str, src: SourceInfo) -> bool:
        """Does relay planning read how far ``name`` got (its chunks, its top), as things
        stand? An origin's and a link's before us in the chain, always: our upstream, a
        link we skip, the link our upstream relays from. A link after us only while we
        hold nothing (did the chain go on without us), lag (a laggard ahead of us), or
        look at our lag (how far back the tail is). In a chain every link tells the one
        before it of each chunk it gains, which that one holds already: read as news, it
        made each tick's plan a fresh scan (tests/test_planner_due.py)."""
        if src.origin or self.lagging or self._lag_seen is not None:
            return True
        if self._missing == self.num_chunks:
            return True
        return self._chain_key(name) <= self._chain_key(self.me)

    def suspend(self, name: str, ticks: int) -> None:
        """Ask ``name`` for nothing new for ``ticks`` (its liveness is in doubt); what is
        in flight to it stays."""
        src = self.sources.get(name)
        if src is not None:
            self._changes += 1
            src.blocked_until = max(src.blocked_until, self.now + ticks)
            self._kept = None

    def seen_all(self, names: Iterable[str]) -> None:
        """The holder view lists ``names`` as alive now (without news of their chunks)."""
        self._changes += 1
        sources, now = self.sources, self.now
        for name in names:
            src = sources.get(name)
            if src is not None:
                src.seen_at = now

    def seen_all_but(self, dead: AbstractSet[str]) -> None:
        """The holder view lists every source but ``dead`` as alive now: :meth:`seen_all`
        without a list of names built for each call (the simulator, which knows who died,
        tells each fetcher at every tick; the lists were a tenth of a 6,144-GPU run).

        Only a change of who is dead is news to planning (``_changes``): a source listed
        alive at every call reads as seen at every call, however far the listing moves."""
        if dead is not self._unlisted:  # (the very set we were given last time: none new)
            if dead != self._unlisted:
                self._changes += 1
            sources = self.sources
            for name in dead:  # (the dead are few; the sources, a trainer's every host)
                if name not in self._unlisted and (src := sources.get(name)) is not None:
                    src.seen_at = max(src.seen_at, self._listed)  # listed last time: keep
            self._unlisted = dead if isinstance(dead, frozenset) else frozenset(dead)
        self._listed = self.now

    def _seen(self, name: str, src: SourceInfo) -> int:
        """The tick the holder view last listed ``name`` as alive: its own, or the last
        :meth:`seen_all_but`'s if that listed it (kept lazily: marking every source at
        every tick was 6 % of a 10,240-GPU simulation). A source added since has its own,
        later tick."""
        if name in self._unlisted or src.seen_at >= self._listed:
            return src.seen_at
        return self._listed

    def remove_source(self, name: str) -> list[int]:
        """A holder left or died: its in-flight chunks go back to the pool. A relay does
        not take it for a link again for ``gone_ticks`` unless it is listed as a holder
        again (see :meth:`_upstream`), nor ever while the view shows nothing it gained
        since (:meth:`_lost`)."""
        src = self.sources.get(name)
        self.unlist_source(name)
        if self.relay:
            self._removed[name] = self.now
            if src is not None and not src.origin:
                self._lost_at[name] = src.top
        return [r.chunk for r in self._forget_requests(name)]

    def unlist_source(self, name: str) -> None:
        """Plan without ``name`` from now on, but keep what is in flight to it on the
        books: a holder that let go of the version still finishes its uploads under way,
        each such chunk is not asked again as a first copy meanwhile, and a twin that
        lands first abandons it (:meth:`received` names it among the losers)."""
        self._changes += 1
        src = self.sources.pop(name, None)
        self._assumed.discard(name)  # (relay's links are sources: a dead one is neither)
        if src is not None:
            self._rack = self._near = None
            self._kept = None
            self._wake(self._rack_waiting)  # perhaps it was their rack owner: look again
            if name in self._full:
                self._full.discard(name)  # the partial counts never included it
                self._nearest_of.clear()
            else:
                for c in src.chunks:
                    self._drop(name, c)

    def unheld(self) -> list[int]:
        """Chunks we lack that no known source holds. The node's holder view lists every
        holder, so there it means no one has them yet; the simulator gives each fetcher a
        few peers, and looks elsewhere for these when holders leave."""
        if self._full:
            return []
        have, held = self.have, self._holders
        return [c for c in range(self.num_chunks) if not have[c] and not held[c]]

    def _forget_requests(self, source: str) -> list[Request]:
        """Every request in flight to ``source`` off the books (each chunk no one else is
        asked for goes back to the pool); returns them as they were (duplicate or not)."""
        out = []
        for c, st in list(self._chunks.items()):
            duplicate = st.requested.pop(source, None)
            if duplicate is not None:
                out.append(Request(source, c, duplicate))
                if not st.requested:
                    del self._chunks[c]
                    self._return(c)
        return out

    def set_dc_fetchers(self, names: Iterable[str], members: Iterable[str] = ()) -> None:
        """Live nodes of our datacenter fetching this version (us included), and its other
        live members: the candidate WAN owners."""
        self.set_dc_view(DcView.of([*names, self.me], members))

    def set_dc_view(self, view: DcView) -> bool:
        """:meth:`set_dc_fetchers` with the lists already made: one view, built once, for
        every planner of a datacenter (the simulator tells each of its fetchers at every
        fetch's start and end; building the lists for each was O(nodes) per fetcher, a
        10,240-GPU run's time growing with the cube of its size)."""
        fetchers = view.fetchers
        i = bisect_left(fetchers, self.me)
        if i == len(fetchers) or fetchers[i] != self.me:
            view = DcView.of([*fetchers, self.me], view.others)  # (we fetch too)
            fetchers = view.fetchers
        if fetchers != self.dc_fetchers or view.others != self.dc_members:
            self._changes += 1
            self._rack_stale = True
            self.dc_fetchers, self.dc_members = fetchers, view.others
            woke = self._reorder()
            if any(c in self._asleep for c in self._rack_waiting):
                woke |= self._refresh_rack()
            return woke
        return False

    def _refresh_rack(self) -> bool:
        """Our rack-mates among the fetchers, derived again after the fetchers changed;
        whether chunks that slept on a rack owner's turn woke (they look again).

        Derived when a chunk sleeps on its rack owner's turn (so a change wakes it) or
        when it is next needed, not at every change: the simulator tells every fetcher of a
        datacenter at each start and end of a fetch, and deriving it there for each was a
        quarter of that cost in a 10,240-GPU run. The same mates, orders and wakes either
        way: while no chunk sleeps on a rack owner, a change wakes nothing, and a chunk
        that waits on one derives them before it sleeps (:meth:`_sleep`)."""
        self._rack_stale = False
        mates = self._rack_mates()
        if mates == self._rack:
            return False
        self._rack = mates
        self._rack_owners.clear()
        return self._wake(self._rack_waiting)

    def _reorder(self) -> bool:
        """The candidate WAN owners changed: owner orders are computed again, and chunks
        that slept on a WAN owner's turn look again; whether any did (a call now may ask
        for them)."""
        self._owners.clear()
        return self._wake(self._waiting)

    def _wake(self, waiting: dict[int, int]) -> bool:
        """Chunks asleep that wait on an owner's turn in ``waiting`` look again (those
        asleep for another reason, a holder backed off, stay: no owner changes that).
        Waking every sleeping chunk of every fetcher at each start and end of a fetch in
        its datacenter was a quarter of a 10,240-GPU simulation."""
        woke = [c for c in waiting if c in self._asleep]
        for c in woke:
            del self._asleep[c]
            self._return(c)
        return bool(woke)

    def received(self, chunk: int, source: str) -> list[Request]:
        """``chunk`` arrived verified from ``source``; returns duplicate requests to cancel."""
        self._changes += 1
        if not self.have[chunk]:
            self.have[chunk] = 1
            self._missing -= 1
        self._unbucket(chunk)
        self._asleep.pop(chunk, None)
        self._waiting.pop(chunk, None)
        self._rack_waiting.pop(chunk, None)
        st = self._chunks.pop(chunk, None)
        self._release(source)
        src = self.sources.get(source)
        if src is not None and chunk not in src.chunks:
            # It sent us the chunk, so it holds it (cutting through, it sends the last piece
            # once the chunk verified there). Its news names only chunks it gained after we
            # first asked it, and a relay asks no further than the run it knows its upstream
            # holds (_prefix): a chunk the upstream held before we asked, that gossip had not
            # told us of yet, left that run short, and the link asked nothing while its
            # upstream was chunks ahead (docs/results.md, session 50; the node's serving side
            # now tells a new asker what it holds, PeerHandler._tell_held, and this covers
            # a complete upstream, which is not told).
            self._gain(source, src, chunk)
        if self.relay:
            self._timed(chunk, source)
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
        self._changes += 1
        self._head.failed(chunk)
        st = self._chunks.get(chunk)
        if st is not None:
            st.requested.pop(source, None)
            if not st.requested:
                del self._chunks[chunk]
                self._return(chunk)
        self._release(source)
        src = self.sources.get(source)
        if src is None:
            return
        if why in (Failure.MISSING, Failure.REFUSED):
            self._begun(source)
        else:
            self._kept = None  # backed off or banned below (those two block one chunk only)
        if why == Failure.CORRUPT:
            src.strikes += 1
            src.banned = src.strikes >= self.cfg.max_strikes
            src.blocked_until = self.now + self.cfg.ban_ticks
        elif why == Failure.MISSING:
            if self.relay:
                self._relay_missing(source, chunk)
            # The hint was stale (its own source died mid-chunk) or early: forget it until
            # the source announces the chunk again, so that no one waits on a holder that
            # is not one (two rack-mates, each hinted to have what the other lacked, once
            # waited for each other forever: simulated crash, seed 1).
            src.chunks.discard(chunk)
            if src is self._relay_src and chunk < self._relay_prefix:
                self._relay_prefix = chunk  # (its run of chunks ends here now)
            self._drop(source, chunk)
            self._block(source, chunk, self.cfg.missing_ticks)
        elif why == Failure.REFUSED:
            if self.relay and source == self._relay_up:
                self._relay_refused(source, src, chunk)
            self._block(source, chunk, self.cfg.refused_ticks)
        elif why == Failure.GONE:
            if self._not_started(source, src):
                self._unstarted.setdefault(source, self.now)
            if self.relay and not src.chunks:
                self._not_begun.add(source)
            wait = self.cfg.missing_ticks if self._starting(source, src) else self.cfg.gone_ticks
            src.blocked_until = self.now + wait
        elif why == Failure.TIMEOUT:
            src.blocked_until = self.now + self.cfg.timeout_ticks
        else:
            src.blocked_until = self.now + self.cfg.backoff_ticks

    def _begun(self, source: str) -> None:
        """``source`` answered for a chunk of this version ("no chunk", or busy): it holds
        the version, so its fetch has begun, whatever it said a moment ago ("unknown
        version": fetches that start together register milliseconds apart). A link that
        has begun but holds nothing yet waits on its own upstream, which is
        ``RELAY_WAIT``'s and ``RELAY_HOP_WAIT``'s to wait for (:meth:`_relayed`), not
        ``RELAY_START_WAIT``'s, which is for a member that does not fetch at all. Left as
        not begun, the tail of an 8-link chain, whose first chunk came 0.22 s in, was
        skipped 0.2 s in by the remembered laggard after it, which asked the link before
        the tail for 3 chunks at its half rate. The tail then got 2/3 of that link's
        uplink, judged itself lagging and relayed from the laggard: 2.84x one copy
        (bench/linerate.py --receivers 8 --case slow --steps 2, the pace verdict on,
        traced; docs/results.md, session 49)."""
        if source in self._not_begun or source in self._unstarted:
            self._effects += 1
            self._not_begun.discard(source)
            self._unstarted.pop(source, None)

    def _relay_refused(self, source: str, src: SourceInfo, chunk: int) -> None:
        """Our upstream refused us ``chunk``. A link that does is lagging (or swamped): we
        relay from the one before it, and it from the tail (see _note_lag), and what we
        had asked of it comes back. An origin sent the chunk to others (and will not
        again): we take it from them, though the origin holds it (a hole it holds would
        be asked again)."""
        if src.origin:
            self._relay_redirected.add(chunk)
            return
        self._effects += 1
        self._lagging.add(source)
        self._take_back(source)

    def _not_started(self, name: str, src: SourceInfo) -> bool:
        """Is a relay link that lacks the version one that has not begun to fetch it yet
        (not a stale hint)? Fetches that start together begin a few milliseconds apart, and
        a link skipped for ``gone_ticks`` sent its downstream to the origin, tangling the
        chain from its first chunk: a link that never held a chunk, during
        ``member_grace``, is asked again soon instead, and waited for meanwhile (up to
        ``RELAY_START_WAIT`` ticks: one that does not fetch at all is skipped then). That
        is a member taken for a link, or a fetcher the holder view lists with no chunk
        (its fetch registered before it began): only the first was, and a chain head that
        began 4 ms after the link behind it lost 5 chunks to that link's requests to the
        origin (bench/linerate.py --case late, a round at 1.28x one copy)."""
        return (
            self.relay
            and not src.chunks
            and self._began is not None
            and self._before(self._began + self.cfg.member_grace)
        )

    def _starting(self, name: str, src: SourceInfo) -> bool:
        """A link that answered it has not begun its fetch, which we wait for a while."""
        since = self._unstarted.get(name)
        return (
            since is not None
            and self._before(since + RELAY_START_WAIT)
            and self._not_started(name, src)
        )

    def _release(self, source: str) -> None:
        src = self.sources.get(source)
        if src is not None and src.inflight > 0:
            self._in_flight(source, src, -1)

    # -- output --------------------------------------------------------------------------------

    @property
    def full(self) -> AbstractSet[str]:
        """Sources that hold every chunk (they need no news of ours)."""
        return self._full

    @property
    def done(self) -> bool:
        return self._missing == 0

    @property
    def held(self) -> int:
        """Chunks we hold (verified), without walking them as :meth:`missing` does."""
        return self.num_chunks - self._missing

    @property
    def inflight(self) -> int:
        return sum(len(st.requested) for st in self._chunks.values())

    def missing(self) -> list[int]:
        return [c for c in range(self.num_chunks) if not self.have[c]]

    def _usable(self, src: SourceInfo) -> bool:
        return not src.banned and not self._before(src.blocked_until)

    # -- the clock, as planning reads it -------------------------------------------------------

    def _before(self, tick: int) -> bool:
        """``now < tick``, noting ``tick`` as one at which this answer changes. Planning
        reads the clock through this (or :meth:`_note`) only, so that a call that finds
        nothing knows the first tick at which a call could find something without an
        input (``_quiet``, :meth:`next_due`): every answer it read from the clock stays
        until then, and so does the path it took."""
        if self.now < tick:
            self._due = min(self._due, tick)
            return True
        return False

    def _note(self, tick: int) -> None:
        """Something this call read changes at ``tick`` (if that is still to come)."""
        if self.now < tick < self._due:
            self._due = tick

    def next_due(self) -> int:
        """The first tick at which :meth:`next_requests` may ask for something it would not
        ask for now, if no input comes meanwhile; ``now`` if a call now may (none was made
        since the last input, or the last one asked for something or changed the plan).
        A driver that calls every tick may skip the calls before it (each would return
        nothing and change nothing); it still advances the ticks (:meth:`tick`) and gives
        every input as it comes. Chunks asleep until a tick (an owner's turn, a holder
        backed off) and the end of ``member_grace`` count in."""
        quiet = self._quiet
        if quiet is None or quiet[0] != self._changes:
            return self.now
        due = quiet[1]
        if self._alarms:
            due = min(due, self._alarms[0][0])
        if self._began is not None and self.dc_members:
            grace = self._began + self.cfg.member_grace
            if self.now < grace < due:
                due = grace
        return due

    def _candidates(self) -> Iterator[int]:
        """Requestable chunks: rarest first (seeded order within a rarity), or in the plain
        seeded order for the first ``initial_random`` picks. Chunks nobody holds are not
        candidates. The caller may take the chunk it was just given out of the pool."""
        held = 0 if self._full else 1  # the least partial count of a chunk someone holds
        if self._picked < self.cfg.initial_random:
            ranks = sorted(-r for k, rs in self._buckets.items() if k >= held for r in rs)
            yield from (self._order[r] for r in ranks)
            return
        for k in sorted(self._buckets):
            if k < held:
                continue
            ranks = self._buckets[k]
            i = len(ranks) - 1
            while i >= 0:  # lazily, from the end: a call usually stops after a few chunks
                yield self._order[-ranks[i]]
                i -= 1  # (the caller may have taken that one out: nothing before it moved)
                i = min(i, len(ranks) - 1)

    def next_requests(self) -> list[Request]:
        """New requests to send now, within every limit."""
        quiet = self._quiet
        if quiet is not None and quiet[0] == self._changes and self.now < quiet[1]:
            return []  # nothing changed since a call found nothing, and nothing is due
        if self._began is None:
            self._began = self.now
            self._effects += 1
        effects = self._effects
        self._due = NEVER
        out = self._next_requests()
        if not out and self._effects == effects:
            self._quiet = (self._changes, self._due)
        return out

    def _next_requests(self) -> list[Request]:
        budget = self.cfg.total - self.inflight
        if budget <= 0:
            return []
        self._expire_blocks()
        if self.relay and (relayed := self._relayed(budget)) is not None:
            return relayed + self._start_news(budget - len(relayed))
        rank_of, free = self._usable_ranks()
        if not free:
            return []
        if not any(self._buckets.values()) and not self._asleep:
            if self._missing > self.cfg.endgame_chunks:
                return []
            return self._endgame(rank_of, free, budget)
        if self._nearest_all_busy(rank_of, free):
            return []
        out: list[Request] = []
        # When the nearest holders of the rarest chunks are all busy, every candidate may be
        # unservable now; stop looking after a bounded run of them (completions will call
        # again soon) instead of walking the whole version on every call.
        patience = SCAN_PATIENCE + 2 * budget
        for c in self._candidates():
            if len(out) >= budget or not free or patience <= 0:
                break
            if not self._bucketed[c]:
                continue
            patience -= 1
            best, src = self._nearest(c, rank_of, free)
            if best == _NONE:
                # Every holder is backed off or has this chunk blocked: out of the pool
                # until the first of them may be asked again (or a new holder appears), so
                # that later scans do not spend their patience on it.
                self._sleep(c, self._unblocked_at(c))
                continue
            if not self._may_go(c, best) or src is None:
                continue  # not our turn to bring it here, or its nearest holders are busy
            out.append(self._request(src, c, duplicate=False))  # (full: out of ``free``)
            patience = SCAN_PATIENCE + 2 * budget
            if src not in free and self._nearest_all_busy(rank_of, free):
                patience = 0
            if best >= 2 * WAN_TIER:
                self.wan_requests += 1
        return out

    def _usable_ranks(self) -> tuple[dict[str, int], AbstractSet[str]]:
        """The usable sources' ranks, and those with room for a request; both only to be
        read. Every planning call needs them (three passes over the sources per call were
        a sixth of a 4,096-GPU simulation), so they are kept: rebuilt only when the
        sources changed or a back-off ended, the room kept current by :meth:`_in_flight`
        (so a request that fills its source takes it out at once; a copy per call for the
        caller to do so was 3 % of a 10,240-GPU simulation)."""
        if self._kept is None or not self._before(self._kept_until):
            now, per_source = self.now, self.cfg.per_source
            ranks: dict[str, int] = {}
            room: set[str] = set()
            until = NEVER
            for n, s in self.sources.items():
                if s.banned:
                    continue
                if s.blocked_until > now:
                    until = min(until, s.blocked_until)
                    continue
                ranks[n] = s.rank
                if s.inflight < per_source:
                    room.add(n)
            self._kept, self._room, self._kept_until = ranks, room, until
            self._note(until)
        return self._kept, self._room

    def _in_flight(self, name: str, src: SourceInfo, delta: int) -> None:
        """``delta`` more requests in flight to ``src``; its room in the kept usable set."""
        src.inflight += delta
        if self._kept is not None and name in self._kept:
            if src.inflight < self.cfg.per_source:
                self._room.add(name)
            else:
                self._room.discard(name)

    def _nearest_all_busy(self, rank_of: dict[str, int], free: AbstractSet[str]) -> bool:
        """Whether no chunk can be asked of anyone now, decided without a scan: every
        chunk's nearest holders include the full holders of the best rank, and those are
        all busy, and no partial holder ranks as near (nor has a chunk blocked that might
        send it farther), and they are in our rack (so a scan would have changed nothing:
        no owner's turn starts). ``rank_of``: the usable sources' ranks. A fetch from full
        holders, the common case, then costs O(sources) per call instead of a scan of
        ``SCAN_PATIENCE`` candidates (35,000 chunks from 8 full holders: 24 candidates
        looked at per completed chunk, all unservable)."""
        if not self._full or self._blocked:
            return False
        full = [(r, n) for n in self._full if (r := rank_of.get(n)) is not None]
        if not full:
            return False
        best = min(full)[0]
        if best >= 2 * RACK_TIER or any(n in free for r, n in full if r == best):
            return False  # (farther, a scan also starts owners' turns: it must run)
        sources = self.sources
        return not any(
            r <= best and n not in self._full and sources[n].chunks for n, r in rank_of.items()
        )

    def _block(self, source: str, chunk: int, ticks: int) -> None:
        """Ask ``source`` for ``chunk`` again only after ``ticks``."""
        self._blocked[(source, chunk)] = self.now + ticks
        self._nearest_of.pop(chunk, None)

    def _expire_blocks(self) -> None:
        """Blocks that ended; the first tick another one ends is noted (:meth:`_before`)."""
        blocked = self._blocked
        if blocked:
            now, soonest, ended = self.now, NEVER, []
            for key, until in blocked.items():
                if until <= now:
                    ended.append(key)
                elif until < soonest:
                    soonest = until
            for key in ended:
                del blocked[key]
                self._nearest_of.pop(key[1], None)
            self._note(soonest)

    def _relayed(self, budget: int) -> list[Request] | None:
        """``relay``'s requests, or None where the swarm decides: we have no upstream, or
        it has room but nothing we may ask it for (it said it lacks them: it may never
        get them), and the swarm fills in meanwhile."""
        self._note_lag()
        up = self._upstream()
        if up is None:
            return None
        src = self.sources[up]
        if not self._usable(src):
            return []  # it has not begun its fetch yet: wait for it (see _not_started)
        if (
            not src.chunks
            and up in self._relay_asked
            and self._waited_out(src, self._relay_hops * RELAY_HOP_WAIT)
        ):
            # It holds nothing and gained nothing for RELAY_WAIT ticks: the swarm fills in.
            # (Asking it again each time its "not yet" expired kept the relay busy for
            # good: two chunks blocked a tick apart always left one to ask, so the wait
            # below never came round; tests/test_planner.py, seed 319.)
            return None
        out, skipped = self._relay_requests(up, budget)
        if skipped and len(out) < budget:
            out += self._repairs(skipped, budget - len(out))
        if len(out) < budget:
            out += self._check_head(up, src)
        if out or src.inflight >= self.cfg.per_source:
            return out + self._side_feed(up, src, budget - len(out))
        if not skipped:  # as far ahead as it lets us be: wait for it, unless it stalled
            if up not in self._relay_asked:
                return self._probe(up)
            if not self._waited_out(src):
                return self._side_feed(up, src, budget)
        return None

    def _side_feed(self, up: str, src: SourceInfo, budget: int) -> list[Request]:
        """While our upstream falls behind the link it relays from (``SIDE_GAP``), one
        chunk at a time from that link: the highest it holds that we lack, none asked,
        past what our upstream will soon pass us, and with neither neighbour held or
        asked here. A link on a half-rate NIC relays at half rate until it judges itself
        lagging (9-10 chunks in, 0.6-0.7 s at 1 Gbit/s), and the link after it got half
        its line rate that long; the other half of its ingress, and of the uplink
        feeding the slow one, idled (bench/linerate.py --case slow, traced: r4 held 10
        chunks when r2 held 20, and ended 10 chunk times after r2). Lone chunks, so that
        our run of chunks from the first (what our downstream asks us for) and our
        highest with a predecessor (what it judges its lag by) do not run ahead of what
        we can pass on: a block of side-fed chunks made a healthy downstream take itself
        for lagging. Only while we keep pace with our upstream (``SIDE_BEHIND``): a link
        falling behind its own upstream is held back by its own ingress, which a side
        chunk only shares, and counted among what it holds, it hid the fall it judges
        its lag by (bench/linerate.py --case slow: the half-rate link took side chunks
        while its upstream paused for the head check, and judged itself lagging late:
        1.33x one copy)."""
        if not self.cfg.side_chunks or budget <= 0 or self.lagging or self._relay_skipped:
            return []
        if src.origin:
            return []
        floor = self._prefix(src)
        if floor - self._relay_from > SIDE_BEHIND:
            return []  # (our own ingress is what holds us back, if anything)
        side = self._side_source(up)
        if side is None:
            return []
        s2 = self.sources[side]
        if not self._side_falling(up, side, s2.top, s2.top - src.top) or s2.inflight:
            return []
        have, asked, last = self.have, self._chunks, self.num_chunks - 1
        floor += self.cfg.per_source  # (what it will soon pass us)
        c = s2.top
        while c > floor:
            if (
                c in s2.chunks
                and not have[c]
                and c not in asked
                and not have[c - 1]
                and c - 1 not in asked
                and (c == last or (not have[c + 1] and c + 1 not in asked))
                and (side, c) not in self._blocked
            ):
                self._effects += 1
                return [self._request(side, c, duplicate=False)]
            c -= 1
        return []

    def _side_falling(self, up: str, side: str, top: int, gap: int) -> bool:
        """Is our upstream ``SIDE_GAP`` behind the link it relays from (``gap``, at that
        link's ``top``) and falling further behind it in each half of that link's last
        ``SIDE_WINDOW`` chunks? A gap that shrinks is a link catching up (one that just
        moved on to a new upstream fills the holes between its lone side-fed chunks at
        its line rate): a side chunk taken then split the uplink it caught up through,
        it fell further behind, judged itself lagging, and so did each link after it in
        turn (simulated, N=8 with r5 at half rate: 1.70x one copy). A gap that jumped
        once and stayed is a stall that is over (a busy host): a side chunk would only
        slow the link now. Nor while our upstream gains nothing in half the window: a
        process that does not run (a busy host's stall, 0.1-0.3 s) falls behind as fast
        as a slow NIC, but a side chunk taken then shares the uplink it catches up
        through once it runs again, and it keeps falling behind, now for want of that
        uplink (bench/linerate.py, N=8 healthy at 1 GiB: side chunks in 3 rounds of 6, the
        cores 93-97 % busy; two links judged lagging in one of them)."""
        if self._side_pair != (up, side):
            self._side_pair = (up, side)
            self._side_gaps.clear()
        gaps = self._side_gaps
        if gaps and gaps[-1][0] == top:
            gaps.pop()
        gaps.append((top, gap))
        while len(gaps) > 1 and gaps[1][0] <= top - SIDE_WINDOW:
            gaps.popleft()
        if gap < SIDE_GAP or gaps[0][0] > top - SIDE_WINDOW:
            return False  # (not that far behind, or not watched for a window yet)
        t_half, half = next((t, g) for t, g in reversed(gaps) if t <= top - SIDE_WINDOW // 2)
        t_then, then = gaps[0]
        ours, ours_half, ours_then = top - gap, t_half - half, t_then - then
        return (
            gap > half > then
            and gap - then > SIDE_WINDOW // 4
            and ours > ours_half > ours_then  # (it gained in each half: not stalled)
        )

    def _side_source(self, up: str) -> str | None:
        """The link our upstream relays from, as we see the chain (see ``_side_feed``):
        the nearest usable link before it that is not lagging; None if that is none, or
        an origin (the origin sends each chunk once: a side chunk from it is egress
        beyond one model)."""
        before = self._relay_before
        try:
            i = before.index(up)
        except ValueError:
            return None
        for name in before[i + 1 :]:
            s = self.sources.get(name)
            if s is None or name in self._lagging or self._lost(name, s):
                continue
            if s.origin or not s.chunks or not self._usable(s):
                return None
            return name
        return None

    def _waited_out(self, up: SourceInfo, more: int = 0) -> bool:
        """Whether our upstream's run of chunks has not grown for ``RELAY_WAIT`` (and
        ``more``) ticks (counted from when we first found it there, as this upstream: a
        link that moved to the chain's tail, whose run was as long as its old upstream's
        when it last waited on that one, early in the fetch, took the wait for long over
        and asked the origin for chunks; tests/test_planner.py)."""
        frontier = self._prefix(up)
        was, run, _ = self._relay_waits
        if up is not was or frontier != run:
            self._effects += 1
            self._relay_waits = (up, frontier, self.now)
        return not self._before(self._relay_waits[2] + RELAY_WAIT + more)

    def _upstream(self) -> str | None:
        """Whom we relay from (``relay``): the nearest node before us in our datacenter's
        name order that we may ask, among its holders of this version (fetching it, or
        done: a chain does not move when its head finishes) and, while fetchers may not
        have learnt of each other yet (``member_grace``), its live members; else the
        nearest origin; None if we may ask none (the fetch then swarms). A link we may not
        ask (dead, backed off) is skipped: its downstream relays from the one before it.
        A lagging link (``LAG_CHUNKS``) comes after every other: the chain's tail."""
        me = self.me
        chain = self._links()
        self._start_news_from = None
        if self._began is None or self._before(self._began + self.cfg.member_grace):
            # (Not one we lost a moment ago, which the membership still lists: a link killed
            # mid-run refused each connection at once, and its downstream asked it again
            # some 8,000 times in the half second of member_grace; tests/test_launch.py.)
            removed, gone = self._removed, self.cfg.gone_ticks
            chain.update(
                n
                for n in (*self.dc_fetchers, *self.dc_members)
                if n not in self.sources
                and ((lost := removed.get(n)) is None or not self._before(lost + gone))
            )
        else:  # members never heard of as holders since are not links any more
            chain -= {n for n in self._assumed if not self.sources[n].chunks} - set(
                self.dc_fetchers
            )
        key = self._chain_key
        mine, lagging = key(me), self.lagging
        held = self.num_chunks - self._missing
        # A laggard relays from the nearest laggard before us that we know of (it refused
        # us, or the holder view says so) and that is ahead of us, else from the tail;
        # never from a link before the tail, though the tail is behind it: it would share
        # that link's uplink with the link after it, which would then fall behind too
        # (measured, 1 GiB: five laggards on one link's uplink, 4.4x one copy). Nor do
        # laggards all share the tail's uplink: a healthy link judged lagging, then the
        # slow one, each got half of it (bench/linerate.py --case slow at lag 4: 2.04x
        # one copy; simulated with a round's starts, r2 then r5: 1.97x, chained 1.24x).
        # A laggard parks what it lacks for a laggard (GetChunk.lagging), so they chain.
        skipped = False  # a live link between us and our upstream (see _note_lag)
        waiting: str | None = None  # the nearest link that has not begun, waited for
        before = sorted((n for n in chain if key(n) < mine), key=key, reverse=True)
        if len(before) != self._relay_hops:  # (the next call's lag look reads it first)
            self._effects += 1
            self._relay_hops = len(before)  # (links before us: see RELAY_HOP_WAIT)
        self._relay_before = before
        if lagging and (ahead := self._laggard_ahead(chain, held)) is not None:
            self._skipped(False)
            return ahead
        for name in before:
            src = self.sources.get(name)
            if src is None:  # a member not yet heard of as a holder: it will be one
                self._effects += 1
                src = self.sources[name] = SourceInfo(RACK_TIER, set(), seen_at=self.now)
                self._assumed.add(name)
                self._kept = None
                self._rack = self._near = None
            if name in self._lost_at and not self._lost(name, src):
                del self._lost_at[name]  # it gained chunks since: a link again
            why = self._passed_over(name, src, lagging, held)
            if why is None:
                if waiting is not None and len(src.chunks) < RELAY_START_AHEAD:
                    if name not in self._start_news_asked:
                        self._effects += 1
                        self._start_news_from = name
                    break  # (it may begin in a moment: see RELAY_START_AHEAD)
                self._skipped(skipped)
                return name
            if why == Passed.STARTING and waiting is None:
                waiting = name  # (waited for a while: it may begin in a moment)
            skipped = skipped or why != Passed.LAGGARD
        if waiting is not None:
            self._skipped(False)
            return waiting
        origins = [
            (s.tier, n)
            for n, s in self.sources.items()
            if s.origin and s.tier < WAN_TIER and self._usable(s)
        ]
        return min(origins)[1] if origins else None

    def _skipped(self, skipped: bool) -> None:
        """Whether our upstream is past a live link (``_relay_skipped``), as this call's
        :meth:`_upstream` found. The next call's lag look reads it before it looks for
        the upstream again, so a change is an effect of the call (``_quiet``)."""
        if skipped != self._relay_skipped:
            self._effects += 1
            self._relay_skipped = skipped

    def _passed_over(self, name: str, src: SourceInfo, lagging: bool, held: int) -> str | None:
        """Why :meth:`_upstream` passes over ``name``, a link before us, on its way to the
        head (a :class:`Passed`), or None: we may relay from it. Pure, so that a trace can
        say why (:meth:`passed_over`)."""
        if lagging and name in self._lagging:
            return Passed.LAGGARD  # (none is ahead of us: _laggard_ahead) to the tail
        if self._lost(name, src):
            return Passed.LOST
        if not lagging and name not in self._full and src.top + 1 + LAG_CHUNKS < held:
            # Far behind us (it joined late, or moved to the tail): it has nothing for
            # us, and relaying from it would hold us to its pace (simulated, a receiver
            # joining halfway: its downstream waited on it, then judged itself lagging).
            return Passed.BEHIND
        if not src.chunks and (not src.inflight or not self._usable(src)):
            # It has not begun this fetch (or not got far): no link until it holds a
            # chunk. (Skipped only while backed off, it drew its downstream back every
            # ``gone_ticks`` to ask again, and the chain after it stalled each time:
            # simulated, a receiver joining halfway.) Waited for a while: it may begin
            # in a moment (RELAY_START_AHEAD). Not while it holds a request of ours asked
            # since its last "unknown version" (it is not backed off): one that has not
            # begun answers at once, so one that began parks them, waiting on its own
            # upstream (the tail of an 8-link chain held the laggard after it's requests
            # for 0.16 s and got its first chunk 0.22 s in; passed over as not begun 0.2 s
            # in, and the laggard's requests shared the uplink of the link before it with
            # the tail: 3.69x one copy; session 49). (The rest of a batch it answered
            # "unknown version" is still in flight as the first answer lands: those are
            # not held.)
            if self._starting(name, src):
                return Passed.STARTING
            if name in self._not_begun:
                return Passed.NOT_BEGUN
        return None if self._usable(src) else Passed.BLOCKED

    @property
    def links_before(self) -> list[str]:
        """The links before us in the chain at our last upstream decision, nearest first
        (a member we lost a moment ago, or one gossip does not list as alive, is none)."""
        return self._relay_before

    def chain_inputs(self) -> dict[str, list[str]]:
        """What our chain is made of (see :meth:`_upstream`): the links the holder view
        lists (``sources``), our datacenter's fetchers and its other live members, and the
        links we take to lag (judged in this fetch or remembered). For a trace."""
        return {
            "sources": sorted(self._links()),
            "fetchers": list(self.dc_fetchers),
            "members": list(self.dc_members),
            "laggards": sorted(self._lagging | set(self._lagged_before)),
        }

    def lost_sources(self) -> dict[str, int]:
        """Sources a relay lost (left, died, or found gone from the holder view), each with
        the tick it was lost at (see :meth:`remove_source`). For a trace."""
        return dict(self._removed)

    def passed_over(self) -> dict[str, str]:
        """Each link before us in the chain, nearest first, and why our last upstream
        decision passed over it (a :class:`Passed`); our upstream itself and the links
        past it are not listed. For a trace: what the node's log cannot show of a move."""
        lagging, held = self.lagging, self.num_chunks - self._missing
        out: dict[str, str] = {}
        for name in self._relay_before:
            src = self.sources.get(name)
            if name == self._relay_up or src is None:
                break
            out[name] = self._passed_over(name, src, lagging, held) or "waited"
        return out

    def _lost(self, name: str, src: SourceInfo) -> bool:
        """Is ``name`` a link we lost (its connection, or a dead verdict) that the holder
        view lists again with nothing gained since? The view's news of it is then older
        than our loss: gossip lists a killed member for a second or more, and a link that
        took it for its upstream again once ``gone_ticks`` had passed asked a dead node and
        held the chain after it up for half a second (bench/linerate.py --case killed,
        traced in a round at 1.47x one copy). A link that is alive gains chunks
        and is a link again (:meth:`_upstream` forgets the loss then)."""
        top = self._lost_at.get(name)
        return top is not None and src.top <= top

    def _start_news(self, budget: int) -> list[Request]:
        """While we wait for a link that has not begun (``RELAY_START_AHEAD``): our last
        missing chunk, asked once of the link before it. That link does not hold it yet, so
        it answers "no chunk" at once and sends nothing, but it tells us of each chunk it
        gains from then on (we asked it for the version). Until then we knew its chunks
        only from gossip, a round late: the receiver after a late one learnt that the link
        before it went on 170 ms in, and waited that long (bench/linerate.py --case late,
        traced)."""
        name = self._start_news_from
        if name is None or budget <= 0 or name in self._start_news_asked:
            return []
        self._start_news_asked.add(name)
        c = self.num_chunks - 1
        while c >= 0 and (self.have[c] or c in self._chunks):
            c -= 1
        if c < 0 or (name, c) in self._blocked:
            return []
        return [self._request(name, c, duplicate=False)]

    def _laggard_ahead(self, chain: set[str], held: int) -> str | None:
        """We lag: the laggard nearest ahead of us (the fewest chunks of those that hold
        more than we do), which parks for us what it lacks (GetChunk.lagging); None: the
        tail. By how far each got, not by name: in name order a slow link judged lagging
        first and a healthy one judged after it (its fall was the slow one's moving
        away) both relayed from the tail, the healthy one at half the tail's uplink
        (bench/linerate.py --case slow, 2 rounds of 9 at 1.9x one copy); the one further
        ahead now feeds the other. A laggard no further than us (the slow one, perhaps)
        would hold us to its pace."""
        ahead = [
            (src.top, name)
            for name in chain
            if name in self._lagging
            and name != self.me
            and (src := self.sources.get(name)) is not None
            and src.top + 1 > held
            and (self._usable(src) or self._starting(name, src))
        ]
        return min(ahead)[1] if ahead else None

    @property
    def _lag(self) -> int:
        """``lag_chunks``, and at least ``per_source`` (see ``LAG_CHUNKS``)."""
        return max(self.cfg.lag_chunks, self.cfg.per_source)

    def _links(self) -> set[str]:
        """Sources that may be links of our datacenter's chain (not origins, not across a
        WAN)."""
        return {n for n, s in self.sources.items() if not s.origin and s.tier < WAN_TIER}

    def _chain_key(self, name: str) -> tuple[bool, str]:
        """A link's place in the chain: name order, laggards (judged in this fetch or
        remembered from the last: set_lagged_before) after every other."""
        return name in self._lagging or name in self._lagged_before, name

    def _note_lag(self) -> None:
        """Mark us lagging once we fell ``LAG_FALL`` further behind our upstream than we
        were while it gained its last ``LAG_WINDOW`` chunks (as we relayed from it), and
        kept falling behind in the ``RELAY_START_WAIT``
        ticks after, or within ``LAG_WATCH`` such waits (a stall on a busy host leaves a
        link as far behind as it fell, for good: the link and its upstream both go on at
        line rate; bench/linerate.py, 1 GiB:
        a healthy link judged itself lagging at 86 % of the model): we then relay from the
        tail, whose uplink no one else uses, and our serving side answers requests for
        chunks we lack "busy" rather than parking them (:attr:`lagging`), which moves our
        downstream on to the link before us
        (:meth:`failed`). Without that, the downstream's requests parked here waited for
        chunks that now reach us only through it.

        How far behind: the upstream's highest chunk, which it tells us of at once once we
        asked it (its run of chunks from the first may lag behind in our view until gossip
        fills in what it held before we asked), against how many we hold (not our run
        of chunks from the first: one repaired late is not a lag). The least lag
        is taken from ``RELAY_START_WAIT`` ticks after we moved to this upstream mid-fetch
        (from the start with the first, when neither held anything before): until
        its news reaches us, it looks nearer than it is, and the first news looked like a
        lag (bench/linerate.py --case slow: a link that had just moved on judged itself
        lagging, and two shared the tail at half rate each). Not judged at all while we
        relay from past a live link (one that had not begun, is far behind, or backed
        off): that link may fetch from our upstream too, sharing its uplink, and we would
        take the slowness for ours (bench/linerate.py --case slow: the slow receiver
        began its fetch late, its downstream went past it, and both judged themselves
        lagging).

        A link that has not begun, or that we heard of only through the holder view
        since, is a link again once the view lists it (set_source)."""
        up = self._relay_up
        if up is None:  # our first plan: we may be late already, before we ask anyone
            self._joined_late(self._upstream())
            return
        src = self.sources.get(up)
        if src is None or src.origin or up in self._lagging or self.lagging:
            return
        if self._relay_skipped:  # (judged afresh, after a while, once it is not)
            self._relay_since = self.now
            self._forget_lag()
            return
        lag = self._lag
        ours = self.num_chunks - self._missing  # (not our run: a hole is not a lag)
        up_count = src.top + 1  # (a full source's top is its last chunk: _promote)
        gap = up_count - ours
        self._discount_stall(gap)
        if gap < 0:  # it is behind us (for now): nothing to judge
            self._forget_lag()
            return
        if self._joined_late(up):
            return
        if self._before(self._relay_since + RELAY_START_WAIT):
            return
        least = self._least_lag(up_count, gap)
        if gap - least < min(LAG_FALL, lag):
            seen = self._lag_seen
            if seen is not None and up_count <= seen[2]:
                # No news of the upstream since the look began: the gap shrank by what we
                # gained meanwhile, not by anything it did. Its news comes behind the chunk
                # data already queued for us (on a half-rate link in bursts up to 150 ms
                # apart); begun again at each burst, the look of a half-rate link ended 11-13
                # chunks in rather than 9, and the links after it ran at its pace meanwhile
                # (bench/linerate.py --case slow, traced; 1.27x one copy instead of 1.39x).
                return
            self._lag_seen = None
            return
        if ours < lag // 2:  # the chain is still forming (first copies redirected, links
            # not yet told of each other): a gap now says nothing of our NIC. (Judged then,
            # five links of one healthy round took themselves for laggards 0-3 chunks in
            # and shared the tail's uplink: 4.4x one copy; bench/linerate.py, session 21.
            # Until session 25 the bound was lag, and a half-rate link waited for it.)
            return
        # (The look runs as it would without the pace, which only brings its verdict
        # forward: see pace.PaceWatch.)
        looked = self._look(gap, up_count, lag)
        paced = not looked and self.cfg.pace_verdict and self._pace.slow()
        if not (looked or paced):
            return
        if self._head_first(up, src) or self._tail_too_far(ours):
            return
        self._effects += 1
        if paced:
            self._pace.verdicts += 1
        self._lagging.add(self.me)
        self._give_back(up)

    def _look(self, gap: int, up_count: int, lag: int) -> bool:
        """The look at whether we keep falling behind, once we fell ``LAG_FALL`` behind our
        upstream (``gap`` now, at its ``up_count``): whether it found us still falling
        behind (the verdict is due). Begun at the first call, it judges once a
        ``RELAY_START_WAIT`` of ticks passed in which the upstream gained
        ``LAG_WATCH_CHUNKS``; ``pace.PaceWatch`` may find the verdict due before."""
        if self._lag_seen is None:  # that far behind: are we still falling behind?
            self._effects += 1
            self._lag_seen = (self.now, gap, up_count)
            return False
        since, then, up_then = self._lag_seen
        grew = gap - then
        # A look is a RELAY_START_WAIT of ticks in which the upstream also gained
        # LAG_WATCH_CHUNKS: at 250 Mbit/s the ticks alone are a chunk and a half, in which
        # a link at half rate falls less than a chunk further behind.
        waits = (self.now - since) // RELAY_START_WAIT
        self._note(since + (waits + 1) * RELAY_START_WAIT)
        looks = min(waits, (up_count - up_then) // LAG_WATCH_CHUNKS)
        if looks < 1:
            return False
        # Still falling behind: by lag // 4 at the first look, by lag // 2 at a later one.
        # News of the upstream's chunks comes in bursts (between the chunks it sends us, on
        # the link that is slow), so one look may find the gap flat for a moment.
        need = lag // 4 if looks < 2 else lag // 2
        if grew < need:
            if looks >= LAG_WATCH:  # a stall (a busy host), not a slow link: it stays
                self._effects += 1
                self._forget_lag()  # as far behind as it fell; go on from here
                self._lag_window.append((up_count, gap))
                self._gap_seen = gap  # (what a stall from here grows it by: _discount_stall)
            return False
        return True

    def _tail_too_far(self, ours: int) -> bool:
        """Is the chain's tail, where a lag verdict would send us, further behind the
        ``ours`` chunks we hold than the chunks we still lack? Then the move cannot pay:
        waiting for the tail to reach us and then taking our rest from it would take longer
        than finishing here even at half rate, and what the links after us gain by it is
        our few chunks left. A
        healthy link behind a head that relays slower than it receives (a busy host)
        fell behind it slowly and was judged at 46-58 of 65 chunks; relaying from the
        tail, 23 chunks behind it, it ended last, 0.8 s after the head (bench/linerate.py
        --case slow --receivers 8, traced, 3 rounds of 4; and session 22's healthy link
        judged at 86 % of a 1 GiB model). Not when a laggard ahead of us would be our
        upstream instead (:meth:`_laggard_ahead`): that one has chunks for us."""
        links = self._links() - {self.me}
        if self._laggard_ahead(links, ours) is not None:
            return False
        # (the tail _upstream would take: a link that holds chunks, not lost or banned)
        feeding = [
            n
            for n in links
            if (s := self.sources[n]).chunks and not s.banned and not self._lost(n, s)
        ]
        if not feeding:
            return False
        tail = self.sources[max(feeding, key=self._chain_key)]
        return ours - (tail.top + 1) > self._missing

    def _head_first(self, up: str, src: SourceInfo) -> bool:
        """Does our lag verdict wait on the head check? Our upstream is the chain's first
        head: falling behind it, we may be slow, or its uplink may be (a NIC slow both
        ways relays slower than it receives: bench/linerate.py --case slow --victim 1, the
        second link got 9 of the head's 16 chunks). Moving us to the tail fixes only the
        first: the next link then relayed from the head, fell behind as we did, and so did
        every link after it (2 rounds of 4 took 4.2-4.8x one copy). The check says which:
        the head is moved to the tail if slow, else we are, at the next look. It waits
        while a probe is out, or goes out now (its pace timed), or for up to
        ``HEAD_WAIT`` ticks while too few of the head's chunks are timed (a link that fell
        behind six chunks in judged itself before a probe could go: 3.0x and 3.2x one
        copy in 2 rounds of 6)."""
        if self._head.probing is not None:
            return True
        if not self._head_checkable(up, src):
            return False
        if self._head.pace(falling=True) is not None:
            return True  # (the probe goes out in this call: _check_head)
        return self._before(self._head.waiting_since(self.now) + HEAD_WAIT)

    def _forget_lag(self) -> None:
        """Judge our lag afresh: no look under way, no lag seen lately."""
        self._lag_seen = None
        self._lag_window.clear()
        self._gap_seen = self._stall_gap = None

    def _discount_stall(self, gap: int) -> None:
        """Our lag is ``gap`` now; if we stalled since the last look (:meth:`stalled`),
        what it grew by meanwhile is the stall's, not our NIC's: the look under way and the
        lags seen lately count from that much further behind."""
        before, self._gap_seen = self._stall_gap, gap
        if before is None:
            return
        self._stall_gap = None
        jump = gap - before
        if jump <= 0:
            return
        self._effects += 1
        if self._lag_seen is not None:
            since, then, up_then = self._lag_seen
            self._lag_seen = (since, then + jump, up_then)
        self._lag_window = deque((up, g + jump) for up, g in self._lag_window)

    def _least_lag(self, up_count: int, gap: int) -> int:
        """Our least lag behind our upstream while it gained its last ``LAG_WINDOW``
        chunks (``gap`` now, at its ``up_count``), counting from our last look before
        them."""
        window = self._lag_window
        if window and window[-1][0] == up_count:
            window.pop()  # (one look per count of its chunks, the latest: at most
            # LAG_WINDOW + 1 looks, however many calls; our lag only shrinks meanwhile)
        window.append((up_count, gap))
        while len(window) > 1 and window[1][0] <= up_count - LAG_WINDOW:
            window.popleft()  # (the newest look from before the window stays: news of
            # the upstream may come in bursts of more than LAG_WINDOW chunks)
        return min(g for _, g in window)

    def stalled(self) -> None:
        """We did not run for a while (the driver's loop was starved of CPU): what our lag
        grows by until our next look is the stall's (:meth:`_discount_stall`). While we did
        not run, our upstream sent on to the end of our socket buffer and then waited, so
        the gap grew in one jump that says nothing of our NIC: a look begun at one stall's
        jump and spanning a second took the second for a slow link (tests/test_planner.py;
        suspected in the rounds where healthy links judged themselves lagging under load,
        docs/results.md, sessions 21 and 22). Until session 40 a stall ended the look
        under way instead, and a look takes ``RELAY_START_WAIT`` ticks: a half-rate link
        that stalled every 250 ms or sooner was never judged, and the links after it would
        relay at its pace (tests/test_planner.py; suspected, not traced, in the CI run where
        a half-rate r3 went unjudged in both steps of bench/linerate.py --case slow, 2.3x
        and 2.4x one copy). Discounted, the look goes on through stalls and judges what we
        did while we ran."""
        self._pace.stalled()
        if self._stall_gap is None and self._gap_seen is not None:
            self._changes += 1
            self._effects += 1
            self._stall_gap = self._gap_seen

    def _joined_late(self, up: str | None) -> bool:
        """Did we begin our fetch once the chain went on without us (``up``, our upstream,
        and the link after us are ``lag`` chunks in)? Then we move to its tail at once,
        and what we asked ``up`` before we knew goes back: left there, our first chunks
        took a share of its uplink from the link after us, which relays from it
        (bench/linerate.py --case late: 4 chunks in 0.6 s, 0.14 s lost there). Judged
        from the first plan on: the holder view tells us how far the others got before
        we ask anyone."""
        src = self.sources.get(up) if up is not None else None
        if up is None or src is None or src.origin or self.lagging:
            return False
        if self._missing < self.num_chunks:
            return False
        lag = self._lag
        up_count = src.top + 1
        if up_count < lag or not self._went_on_without_us(lag):
            return False
        self._effects += 1
        self._lagging.add(self.me)
        self._give_back(up)
        return True

    def _went_on_without_us(self, lag: int) -> bool:
        """Is the link after us in the chain ``lag`` chunks in already (it relays past us:
        we began late)? Then relaying from our upstream would share its uplink with that
        link, and the tail is where we belong (simulated, a receiver joining halfway: its
        downstream ran at half rate until the joiner judged itself lagging)."""
        key = self._chain_key
        mine = key(self.me)
        after = [n for n in self._links() if key(n) > mine and n not in self._lagging]
        if not after:
            return False
        nxt = self.sources[min(after, key=key)]
        return nxt.top + 1 >= lag

    @property
    def paced(self) -> bool:
        """Did our lag verdict come from our pace, before the look ended (``pace``)?"""
        return self._pace.verdicts > 0

    @property
    def remembered_lagging(self) -> bool:
        """Did we begin at the chain's tail, our last fetch of the key having ended
        lagging (:meth:`set_lagged_before`)?"""
        return self.me in self._lagged_before

    @property
    def relay_upstream(self) -> str | None:
        """The relay link we last asked for chunks (None: none yet, or we swarm)."""
        return self._relay_up

    @property
    def lagging(self) -> bool:
        """Do we relay from the tail, having fallen behind (see :meth:`_note_lag`)?"""
        return self.me in self._lagging

    def _take_back(self, source: str) -> None:
        """Every request in flight to ``source`` back to the pool; the session abandons
        them (:meth:`taken_back`), each as what it was (an endgame copy too)."""
        for r in self._forget_requests(source):
            self._taken_back.append(r)
            self._release(source)

    def _give_back(self, up: str) -> None:
        """We just moved to the chain's tail: what we asked ``up``, our upstream until now,
        goes back to the pool (``PlannerConfig.lag_gives_back``), unless we relay from it
        still (the tail is the link before us: asked again, the same chunks would be cut
        and sent twice)."""
        if self.cfg.lag_gives_back and self._upstream() != up:
            self._take_back(up)

    def _timed(self, chunk: int, source: str) -> None:
        """``chunk`` landed from ``source``: the chain's pace, and the head check's probe
        (see ``headcheck``). A head found slow is a laggard to us at once (we relay from
        the origin from now on), and the session tells it so (:meth:`behind`), and the
        origin too, before it asks the origin anything more. What we had asked the head
        for is taken back and asked of the origin: left there, it came at the head's
        pace, and the chain after us waited on it, in order (simulated: the links after
        the new head at 1.27x one copy, the new head itself at 1.18x; taken back, both
        1.24-1.25x, and at 250 Mbit/s 1.22x instead of 1.35x)."""
        settled = max(self._relay_since, self._began or 0) + HEAD_SETTLE
        if source == self._relay_up:
            if self.now >= settled:  # (not while the chain settles: see HeadCheck.pace)
                self._head.arrived(self.now)
            up = self.sources.get(source)
            if up is not None and self.cfg.pace_verdict:  # (nothing reads it otherwise)
                self._pace.arrived(self.now, up.top + 1)
        slow = self._head.landed(chunk, self.now)
        if slow is not None:
            self._effects += 1
            self._lagging.add(slow)
            self._behind.append(slow)
            self._take_back(slow)

    def _head_checkable(self, up: str, src: SourceInfo) -> bool:
        """Is our upstream a head the head check may still probe (see ``headcheck``)? It
        is the chain's head (the only link before us), not done, not checked yet, enough
        is left for a faster chain to matter, and no link is lagging.

        Once one is, the chain is settling for a while (what a link moved to the tail
        still has in flight goes on at its pace), and a head's pace then says nothing of
        it: checked then, each new head was found slow in turn (simulated, the slow
        head's case: 2.2-2.4x one copy, 5.7x at 1 GiB, against 1.15-1.27x checking the
        first head alone). Nor is a check needed then: a link that falls behind the head
        checks it before it judges itself lagging (``_head_first``), so a second link
        that moved to the tail found the head healthy."""
        return (
            self.cfg.head_check
            and self._relay_hops == 1
            and not self._relay_skipped
            and not self.lagging
            and not src.origin
            and up not in self._full
            and not self._lagging
            and self._missing >= HEAD_MIN_MISSING  # (the probe's chunk time is worth it)
            and not self._head.checked(up)
        )

    def _check_head(self, up: str, src: SourceInfo) -> list[Request]:
        """The head check's probe, if it is due: the head is checkable and its pace timed
        (from half as many chunks if we are falling behind it: then the check decides
        whose the slowness is, see ``_head_first``).

        The chunk asked of the origin is the last full one missing that no link holds
        and no one is asked for: far ahead of the head's stream, so that neither the head
        nor we ask for it again soon (see ``headcheck``)."""
        if self._relay_hops != 1 or self._relay_skipped:
            self._head.moved()  # (it is not the head now: timed afresh once it is)
            return []
        if not self._head_checkable(up, src):
            return []
        pace = self._head.due(up, falling=self._lag_seen is not None)
        if pace is None:
            return []
        origins = [
            (s.tier, n)
            for n, s in self.sources.items()
            if s.origin
            and s.tier < WAN_TIER
            and self._usable(s)
            and s.inflight < self.cfg.per_source
        ]
        if not origins:
            self._effects += 1  # (a lag look reads it: see _quiet)
            self._head.skip(up)  # (no check this fetch: a lag verdict may not wait on it)
            return []
        origin = min(origins)[1]
        c = self.num_chunks - 2  # (the last chunk may be short: it would come fast)
        while c > src.top and (
            self.have[c]
            or c in self._chunks
            or (origin, c) in self._blocked
            or any(not self.sources[h].origin for h in self._holders[c])  # (a link has it)
        ):
            c -= 1
        if c <= src.top + self.cfg.per_source:
            self._effects += 1
            self._head.skip(up)  # (nothing far enough ahead of the head's stream)
            return []
        self._effects += 1
        self._head.sent(up, c, self.now, pace)
        return [self._request(origin, c, duplicate=False)]

    def onward(self, r: Request) -> bool:
        """Whether ``r``'s source may count us among the chunk's recipients (an origin
        sends later askers to them). Not for a head check's probe: the head asks the
        origin for that chunk in its turn, and sent to us instead, it took it from our
        uplink, which streams to the link after us (simulated, bench/linerate.py's
        healthy N=4: the last two receivers lost a chunk time to it, 1.034x one copy
        instead of 1.019x)."""
        return not (r.chunk == self._head.probing and self.sources[r.source].origin)

    def told_behind(self) -> bool:
        """The link after us found us slower than the origin could feed it (its head
        check, see ``headcheck``): we move to the chain's tail, as a link that judged
        itself lagging does. Only while we relay from an origin (we are the chain's
        head): from anyone else it is stale news. Whether we moved."""
        up = self._relay_up
        src = self.sources.get(up) if up is not None else None
        if up is None or src is None or not src.origin:
            return False
        if not self.relay or self.lagging or self.done:
            return False
        self._changes += 1
        self._effects += 1
        self._lagging.add(self.me)
        # (Given back before the origin skipped laggards, the simulated chain after us
        # stalled, 2.0-2.9x one copy: the origin sent the new head back to us.)
        self._give_back(up)
        return True

    def behind(self) -> list[str]:
        """Chain heads found slow since the last call (see :meth:`_timed`): the caller
        tells each (the node's ``Behind`` message)."""
        out, self._behind = self._behind, []
        return out

    def taken_back(self) -> list[Request]:
        """Requests the planner took back since the last call (see :meth:`_note_lag`): the
        caller stops each, as it stops an endgame loser."""
        out, self._taken_back = self._taken_back, []
        return out

    def _probe(self, up: str) -> list[Request]:
        """Our lowest missing chunk, asked of an upstream we never asked anything (a link
        that closes a gap in the chain: the one before us died). Until we ask, we know its
        chunks only from gossip, a round late, and seemed ahead of it: we waited, then
        swarmed, and another link's uplink carried two streams (bench/linerate.py, a link
        killed mid-chain: the rest ran at half rate). It parks the request if it asked for
        the chunk itself, and tells us of each chunk it gains from then on."""
        self._effects += 1
        self._relay_asked.add(up)
        c = self._relay_from
        while c < self.num_chunks and (self.have[c] or c in self._chunks):
            c += 1
        if c >= self.num_chunks or (up, c) in self._blocked:
            return []
        return [self._request(up, c, duplicate=False)]

    def _repairs(self, chunks: list[int], budget: int) -> list[Request]:
        """``chunks`` that our upstream may never give (holes, redirects), each from its
        nearest holder with room: the swarm, for those chunks only. (A swarm request for
        any other chunk would take from the origin what the chain is bringing, and the
        origin then redirects the chain's head for it.)"""
        rank_of, free = self._usable_ranks()
        out: list[Request] = []
        for c in chunks:
            if len(out) >= budget or not free:
                break
            if not self._bucketed[c]:
                continue
            best, src = self._nearest(c, rank_of, free)
            if best == _NONE or src is None:
                continue
            out.append(self._request(src, c, duplicate=False))  # (full: out of ``free``)
        return out

    def _relay_requests(self, up: str, budget: int) -> tuple[list[Request], list[int]]:
        """Requests to our upstream: the lowest missing chunks not in flight, up to
        ``per_source`` in flight and no further ahead than it may soon hold; and the
        chunks within that reach skipped because the upstream may never give them (a
        hole: it stalled, or it redirected us). Without such a skip, nothing to ask means
        we are as far ahead as it lets us be: we wait for its news rather than swarm (a
        swarm request to the origin takes one of its upload slots from the chain's
        head)."""
        if up != self._relay_up:
            self._effects += 1
            self._relay_up, self._relay_frontier, self._relay_moved = up, -1, self.now
            # (the first upstream we have nothing from: no news of it to wait for)
            begun = self._missing < self.num_chunks
            self._relay_since = self.now if begun else -_NONE
            self._forget_lag()
            self._head.moved()
            self._pace.moved()
            self._relay_misses.clear()
            self._relay_holes.clear()
            self._relay_redirected.clear()
        src = self.sources[up]
        room = min(budget, self.cfg.per_source - src.inflight)
        if room <= 0:
            return [], []
        full = up in self._full
        reach = self.num_chunks if full else self._prefix(src) - 1 + self.cfg.per_source
        out: list[Request] = []
        c = self._relay_from
        while c < self.num_chunks and self.have[c]:
            c += 1
        self._relay_from = c
        holes = self._relay_holes
        skipped: list[int] = []
        while c < min(reach + 1, self.num_chunks) and len(out) < room:
            if not self.have[c] and c not in self._chunks:
                if (c in holes and c not in src.chunks) or c in self._relay_redirected:
                    skipped.append(c)
                elif (up, c) not in self._blocked:  # (blocked: it said "not yet"; ask again)
                    out.append(self._request(up, c, duplicate=False))
            c += 1
        if out:
            self._relay_asked.add(up)
        return out, skipped

    def _prefix(self, src: SourceInfo) -> int:
        """How many of the first chunks our upstream holds without a gap: how far its own
        relay got, and what we may ask it for (with ``per_source`` more it will soon have).
        Not its highest chunk: one it took from the swarm out of order (before the chain
        stood, or a hole repaired) had every downstream ask it for chunks far ahead of
        what it had asked for itself, and each "not held" that earned left one more
        chunk to the swarm (bench/linerate.py, the relay cutting through)."""
        p = self._relay_prefix if src is self._relay_src else 0
        while p < self.num_chunks and p in src.chunks:
            p += 1
        self._relay_src, self._relay_prefix = src, p
        return p

    def _relay_missing(self, source: str, chunk: int) -> None:
        """Our upstream said it lacks ``chunk``. Within the run of chunks it holds from
        the first (a stale hint), that is a hole it may never fill; past it, it will have
        it soon, unless it keeps saying so
        (``RELAY_PATIENCE`` times and for ``RELAY_STALL`` ticks with no chunk gained in
        between: it stalled; an upstream
        that is only slow, on a busy host, keeps gaining). Either way the chunk is then
        left to the swarm until the upstream announces it. An upstream that holds nothing
        yet has not begun (it waits on its own upstream, say a member that fetches late):
        not a stall, and waiting for it is ``RELAY_WAIT``'s (counted as a stall, each link
        after it took its first chunks from the swarm, from the chain's head and the
        origin, and slowed the head's stream: simulated, a receiver joining halfway)."""
        if source != self._relay_up:
            return
        src = self.sources.get(source)
        if src is not None and not src.chunks:
            return
        frontier = self._prefix(src) if src is not None else 0
        if chunk < frontier:
            self._relay_holes.add(chunk)
            return
        if frontier > self._relay_frontier:  # it moved on since: slow, not stalled
            self._relay_frontier, self._relay_moved = frontier, self.now
            self._relay_misses.clear()
        self._relay_misses[chunk] += 1
        stalled = self.now >= self._relay_moved + RELAY_STALL
        if self._relay_misses[chunk] >= RELAY_PATIENCE and stalled:
            self._relay_holes.add(chunk)

    def _nearest(
        self, c: int, rank_of: dict[str, int], free: AbstractSet[str]
    ) -> tuple[int, str | None]:
        """The best rank among ``c``'s usable holders, and the least-loaded free source at
        that rank (a chunk is only ever asked of its nearest holders); (_NONE, None) if no
        holder may be asked. The holders at the best rank are kept per chunk
        (``_nearest_of``); only which of them are free is looked at each time."""
        if rank_of is not self._nearest_for:
            self._nearest_of.clear()
            self._nearest_for = rank_of
        kept = self._nearest_of.get(c)
        if kept is None:
            kept = self._nearest_of[c] = self._nearest_holders(c, rank_of)
        best, names = kept
        src, load, sources = "", 0, self.sources
        for n in names:  # (_least_loaded of the free ones, inlined: 4 M calls at 10,240 GPUs)
            if n in free:
                inflight = sources[n].inflight
                if not src or inflight < load or (inflight == load and n < src):
                    src, load = n, inflight
        return best, src or None

    def _nearest_holders(self, c: int, rank_of: dict[str, int]) -> tuple[int, tuple[str, ...]]:
        """One pass over ``c``'s holders: the best usable rank, and the holders at it that
        ``c`` is not blocked at."""
        names: list[str] = []
        best, blocked, rank = _NONE, self._blocked, rank_of.get
        for n in self._holders_of(c):
            r = rank(n)
            if r is None or r > best or (blocked and (n, c) in blocked):
                continue
            if r < best:
                best, names = r, []
            names.append(n)
        return best, tuple(names)

    def _may_go(self, c: int, best: int) -> bool:
        """Whether ``c`` may be fetched from rank ``best`` now: across the WAN or into our
        rack only on our turn, and never past a nearer holder that is only backed off
        (then ``c`` sleeps until it is back)."""
        if best >= 2 * WAN_TIER:
            back = self._near_holder_back_at(c, 2 * WAN_TIER)
            if back is not None:
                # A holder in our datacenter is only backed off (busy, refused): wait for
                # it. Crossing the WAN for a chunk the DC has costs far more.
                self._sleep(c, back)
                return False
            return self._may_cross_wan(c)
        if best >= 2 * RACK_TIER and self.cfg.rack_owners:
            back = self._near_holder_back_at(c, 2 * RACK_TIER)
            if back is not None:
                self._sleep(c, back)  # a rack-mate has it and is only busy: wait for it
                return False
            return self._may_enter_rack(c)
        return True

    def _may_cross_wan(self, chunk: int) -> bool:
        """May we fetch ``chunk`` across the WAN now? If not, it sleeps until it might.

        A relay link swarms only as its datacenter's chain head (no link before it) or to
        repair what its upstream cannot give: it may always cross. The chunk's owner is
        most likely a link that relays from its upstream and never crosses, and waiting
        for it (alive, fetching) left a datacenter's whole chain with nothing: every
        rollout of the remote datacenter failed the version (tests/test_launch.py)."""
        if self.relay:
            return True
        order = self._owners.get(chunk)
        if order is None:
            members = (
                self.dc_members if self._before((self._began or 0) + self.cfg.member_grace) else []
            )
            order = self._owners[chunk] = owner_order(chunk, [*self.dc_fetchers, *members])
        return self._our_turn(chunk, order, self._waiting)

    def _may_enter_rack(self, chunk: int) -> bool:
        """May we fetch ``chunk`` from outside our rack now? Only its rack owner may, first
        (a relay link may at once, as across the WAN: see :meth:`_may_cross_wan`)."""
        if self.relay:
            return True
        if self._rack is None:
            self._rack_stale = False
            self._rack = self._rack_mates()
            self._rack_owners.clear()
        elif self._rack_stale:
            self._refresh_rack()  # (wakes nothing: no chunk sleeps on a rack owner)
        if len(self._rack) < 2:
            return True  # no rack-mate fetches this version: nobody to share with
        order = self._rack_owners.get(chunk)
        if order is None:
            order = self._rack_owners[chunk] = owner_order(chunk, self._rack)
        return self._our_turn(chunk, order, self._rack_waiting)

    def _rack_mates(self) -> list[str]:
        """Our rack-mates among the fetchers, us included, sorted: found from our sources,
        fewer than a large datacenter's fetchers, each looked up in the sorted list."""
        if self._near is None:  # (kept: a start or end of a fetch in our datacenter asks
            # every fetcher's planner again, and a trainer's hosts are all its sources)
            self._near = [n for n, s in self.sources.items() if s.tier <= SAME_RACK]
        fetchers, n = self.dc_fetchers, len(self.dc_fetchers)
        mates = {self.me}
        for name in self._near:
            if (i := bisect_left(fetchers, name)) < n and fetchers[i] == name:
                mates.add(name)
        return sorted(mates)

    def _our_turn(self, chunk: int, order: list[str], waiting: dict[int, int]) -> bool:
        """Is it our turn in ``order`` to bring ``chunk`` in? If not, it sleeps until it
        might be (``waiting`` remembers since when it waits)."""
        turn = order.index(self.me)
        if turn == 0:
            return True
        since = waiting.get(chunk)
        if since is None:
            since = waiting[chunk] = self.now
            self._effects += 1
        our_turn = since + turn * self.cfg.owner_timeout
        if self._before(our_turn):
            self._sleep(chunk, our_turn)
            return False
        # Our turn by the clock; but an owner ahead of us that the holder view still lists
        # (alive, fetching this version) will bring it, however slow its link: a second
        # copy would only slow both down. Take over only from owners that died, failed us,
        # or are not fetching at all.
        alive = [
            seen
            for ahead in order[:turn]
            if (s := self.sources.get(ahead)) is not None
            and not s.banned
            and self._before((seen := self._seen(ahead, s)) + self.cfg.owner_timeout)
        ]
        if alive:
            self._sleep(chunk, min(alive) + self.cfg.owner_timeout)
            return False
        return True

    def _near_holder_back_at(self, c: int, below: int) -> int | None:
        """When a holder of ``c`` ranked below ``below`` (inside our datacenter, or our
        rack) that only deferred this chunk (busy, or not there yet) may be asked again; None
        if there is none. A source backed off for failing (an error, a corrupt chunk) does
        not count: the farther holders are the way round it."""
        when = [
            self._blocked[(n, c)]
            for n in self._holders_of(c)
            if (s := self.sources.get(n)) is not None
            and s.rank < below
            and self._usable(s)
            and (n, c) in self._blocked
        ]
        return max(min(when), self.now + 1) if when else None

    def _unblocked_at(self, c: int) -> int:
        """The first tick at which some holder of ``c`` may be asked for it again."""
        when = [
            max(s.blocked_until, self._blocked.get((n, c), 0))
            for n in self._holders_of(c)
            if (s := self.sources.get(n)) is not None and not s.banned
        ]
        return max(min(when, default=self.now + self.cfg.gone_ticks), self.now + 1)

    def _least_loaded(self, names: list[str]) -> str | None:
        return min(names, key=lambda n: (self.sources[n].inflight, n)) if names else None

    def _request(self, source: str, chunk: int, duplicate: bool) -> Request:
        self._changes += 1
        st = self._chunks.setdefault(chunk, _Chunk())
        st.requested[source] = duplicate
        self._unbucket(chunk)
        self._in_flight(source, self.sources[source], +1)
        self._picked += 1
        return Request(source, chunk, duplicate)

    def _endgame(
        self, rank_of: dict[str, int], free: AbstractSet[str], budget: int
    ) -> list[Request]:
        out: list[Request] = []
        for c in sorted(self._chunks, key=self._rank.__getitem__):
            if len(out) >= budget or not free:
                break
            st = self._chunks[c]
            if self.have[c] or not st.requested or len(st.requested) > self.cfg.endgame_copies:
                continue
            cands = [
                n
                for n in self._holders_of(c)
                if n in rank_of and n not in st.requested and (n, c) not in self._blocked
            ]
            if not cands:
                continue
            best = min(rank_of[n] for n in cands)
            if best >= 2 * WAN_TIER:
                continue  # a duplicate never crosses the WAN: that is the traffic we save
            src = self._least_loaded([n for n in cands if rank_of[n] == best and n in free])
            if src is not None:
                out.append(self._request(src, c, duplicate=True))  # (full: out of ``free``)
        return out

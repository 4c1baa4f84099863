"""One version moving through a simulated cluster, scheduled by the real tensorhub cores.

Every fetcher runs :class:`~tensorhub.core.swarm.ChunkPlanner`; every origin serves with
:class:`~tensorhub.core.swarm.SuperSeeder`; every node shares its uplink through
:class:`~tensorhub.core.swarm.UploadSlots` — the same objects the real driver runs. This
module only plays the network: requests travel with the path's latency, a chunk is a flow
on the max-min fair network, replies (served, no such chunk yet, redirect) come back as
the real peer protocol would send them.

Modelling assumptions (each a parameter): a chunk is ``size / chunks`` bytes (coarser than
the real 4 MiB so terabyte models stay tractable), served while it is still arriving and
never ahead of its upstream (``cut_through``: the real node serves each 4 MiB chunk it has,
or, with the relay preset's ``cut_through``, each piece as it lands); each fetcher knows
the origins, complete holders and ``peers`` other fetchers (nearest first, then random: a
BitTorrent-style peer set, where the real holder view lists everyone); a node's peers learn
a chunk ``hint_delay`` after its transfer began (``early_hints``; otherwise, as the node,
after it arrived) (gossip, redirects);
the planner ticks every ``tick`` of virtual time. Measured (``python -m sim reproduce``):
a standalone RL step's updates take 1.05x their lower bound on average, a pure broadcast
1.07x (its last receiver 1.09x; 256 chunks; see docs/results.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from collections.abc import Callable, Hashable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from tensorhub.core.gossip.holders import SAME_RACK
from tensorhub.core.swarm import (
    ChunkPlanner,
    DcView,
    PlannerConfig,
    Request,
    SeedDecision,
    SuperSeeder,
    UploadSlots,
    holder_seeder,
)
from tensorhub.core.swarm.planner import NEVER
from tensorhub.core.swarm.presets import SIMULATED, DataPlaneConfig
from tensorhub.core.swarm.serve import (
    Verdict,
    fetch_starting,
    past_laggards,
    seed_context,
    serve_decision,
    started_parks,
)
from tensorhub.core.swarm.session import (
    Abandon,
    Action,
    Behind,
    FetchSession,
    Outcome,
    Send,
    Settle,
)
from tensorhub.testing.planner_due import check_quiet_until_due

from .engine import Engine
from .network import Network, Transfer
from .topology import Cluster


@dataclass(frozen=True)
class SwarmConfig:
    chunks: int = 64
    peers: int = 16
    hint_delay: float = 0.002
    tick: float = 0.0  # 0: the time one chunk takes at NIC rate (the real one's ratio)
    super_seed: bool = True
    # A node serves a chunk while it is still receiving it, never ahead of the bytes that
    # have arrived (the network paces the follower by its upstream): the real node serves
    # each 4 MiB chunk once it has it, and a simulated chunk is a run of many of them.
    # Off: a simulated chunk is served only once whole (store and forward).
    cut_through: bool = SIMULATED.cut_through
    # With cut-through: peers learn of a chunk ``hint_delay`` after its transfer began, so
    # they ask for it while it lands (a coarse chunk is a run of many real ones, each
    # announced as it is verified). Off: as the node, a chunk is announced once whole, and
    # a request for one asked for but not landing yet is parked until it begins to land
    # (serve.serve_decision), which is what lets a relay's next hop trail by a piece.
    early_hints: bool = True
    # As the node (presets.park_starting): a fetch that began and holds nothing parks
    # requests for the first chunks (serve.serve_decision's ``starting``).
    park_starting: bool = SIMULATED.park_starting
    # The rest are the data plane's settings: tensorhub.core.swarm.presets.SIMULATED, a
    # named departure from the node's (presets.DEPARTURES says why each one differs).
    reserve_after: float = SIMULATED.reserve_after
    seed_spare: bool = SIMULATED.seed_spare  # an origin with idle slots sends repeat copies
    every_holder_seeds: bool = SIMULATED.every_holder_seeds  # fetched copies super-seed too
    slots: int = SIMULATED.upload_slots
    max_waiting: int = SIMULATED.max_waiting  # beyond this many waiting: "busy"
    near_waiting: int | None = SIMULATED.near_waiting  # for a rack-mate
    uploads_per_peer: int | None = SIMULATED.uploads_per_peer
    record: bool = False  # keep each fetch session's inputs (FetchSession.record)
    # The planner's member_grace, in ticks; None: the ticks of ``hint_delay`` (see
    # Swarm.__init__). The bench's mirror (sim/fanout.py) passes the node's.
    member_grace: int | None = None
    planner: PlannerConfig = field(default_factory=lambda: SIMULATED.planner)
    # Tests: plan at every tick of a fetch, as the node's loop wakes, and at each tick the
    # planner would skip (before ChunkPlanner.next_due) check on a copy that a scan finds
    # nothing (tensorhub.testing.planner_due). Slow: a copy of a planner per tick.
    check_due: bool = False

    @classmethod
    def of(cls, dataplane: DataPlaneConfig, **rest: Any) -> SwarmConfig:
        """The simulator running ``dataplane``'s settings (the inverse of :meth:`dataplane`),
        with ``rest`` for the simulator's own (chunks, cut_through, tick, ...)."""
        return cls(**{ours: getattr(dataplane, theirs) for ours, theirs in _SHARED.items()}, **rest)

    def dataplane(self) -> DataPlaneConfig:
        """These settings as the data plane's config object."""
        return DataPlaneConfig(**{theirs: getattr(self, ours) for ours, theirs in _SHARED.items()})


_SHARED = {
    "planner": "planner",
    "slots": "upload_slots",
    "max_waiting": "max_waiting",
    "near_waiting": "near_waiting",
    "uploads_per_peer": "uploads_per_peer",
    "reserve_after": "reserve_after",
    "seed_spare": "seed_spare",
    "every_holder_seeds": "every_holder_seeds",
    "cut_through": "cut_through",
    "park_starting": "park_starting",
}
"""SwarmConfig's settings that are the data plane's (ours → DataPlaneConfig's name): one
table for both directions, so a new setting cannot be mapped one way only."""


@dataclass(frozen=True)
class _Queued:
    """A request served here, waiting for an upload slot (the node's queued reply)."""

    asker: str
    request: Request
    back: float  # the reply's latency
    sending: int  # which sending of the request (see _Node.issue)


@dataclass
class _Node:
    name: str
    have: bytearray
    planner: ChunkPlanner | None = None
    session: FetchSession | None = None  # the fetch's request lifecycle (the node's core)
    planner_seed: float = 0.0  # its planner's RNG seed (to build the same one again)
    seeder: SuperSeeder | None = None
    slots: UploadSlots = field(default_factory=UploadSlots)
    queued: dict[int, _Queued] = field(default_factory=dict)  # ticket → upload waiting
    followers: list[str] = field(default_factory=list)  # who has us in their peer set
    started: float | None = None  # when its fetch began (None: not yet)
    finished: float | None = None
    last_sent: float = 0.0  # when the last chunk it served arrived (a trainer's release)
    dead: bool = False
    wake_pending: bool = False
    due_wake: int = -1  # the planner tick a wake is set for (next_due), -1: none
    news_pending: bool = False  # a peer's news arrived: plan at the next tick
    seen_tick: int = -1  # the planner tick its sources were last marked seen
    inflight: dict[Request, Transfer | None] = field(default_factory=dict)
    issue: dict[Request, int] = field(default_factory=dict)
    """Which sending of each request in flight is the live one: the session may abandon a
    request and ask the same again (an equal Request) while the first is still queued at
    its source; the node tells them apart by request id, and every event of a sending
    here carries its number (a stale one is a reply to a request given up)."""
    parked: dict[int, list[Callable[[], None]]] = field(default_factory=dict)
    starting: dict[int, list[Callable[[], None]]] = field(default_factory=dict)
    """Requests parked until a chunk begins to land here (cut-through without early
    hints), or until it settles."""
    lagging: bool = False  # a relay link that fell behind: it parks no request
    traced_up: str | None = None  # the relay upstream last told to Swarm.timeline
    laggards: set[str] = field(default_factory=set)  # an origin's, told by Behind.who
    withdrawn: bool = False  # let go of the version (unpublished, or its memory reused)
    on_drained: Callable[[], None] | None = None  # once no upload reads it (withdrawn)

    def starting_fetch(self, chunk: int) -> bool:
        """As the node's ``Replica.starting`` (one rule: ``fetch_starting``)."""
        fetching = self.started is not None and self.finished is None
        return fetch_starting(chunk, fetching=fetching, lagging=self.lagging, have=self.have)

    def mark(self, chunk: int, cut_through: bool) -> None:
        """``chunk`` is held here, as the node's ``Replica.mark``: if it is the first, what
        was parked only because this fetch was starting is answered again."""
        first = self.have.find(1) < 0
        self.have[chunk] = 1
        if first:
            waiting = self.starting if cut_through else self.parked
            for c in started_parks(waiting, self.receiving):
                for answer in waiting.pop(c, []):
                    answer()

    def lag(self, cut_through: bool) -> None:
        """As the node's ``Replica.lag``: its fetch relays from the tail now; who is parked
        here is answered again (busy). Cutting through, ``parked`` also holds transfers
        whose bytes wait on the rest of their chunk: those go on."""
        self.lagging = True
        waiting = self.starting if cut_through else self.parked
        for chunk in list(waiting):
            for answer in waiting.pop(chunk):
                answer()

    def receiving(self, chunk: int) -> bool:
        """Bytes of ``chunk`` are on their way here (a transfer holds a slot at a source).
        Not: a request still in the air or queued, or one whose bytes all arrived and wait
        on a cut-through upstream (two such nodes could otherwise wait on each other)."""
        return any(r.chunk == chunk and t is not None for r, t in self.inflight.items())

    def requested(self, chunk: int, asker: str) -> bool:
        """A request for ``chunk`` is out, to someone other than ``asker`` (as the node's
        ``Replica.incoming``: it parks requests for a chunk from the moment it asks for it,
        but not the peer it asked, which would wait on it while it waits on that peer)."""
        return any(r.chunk == chunk and r.source != asker for r in self.inflight)

    def settle(self, chunk: int) -> None:
        for answer in self.parked.pop(chunk, []):
            answer()
        self.landing(chunk)

    def landing(self, chunk: int) -> None:
        """Bytes of ``chunk`` began to land here (or it settled): ask again who waited."""
        for answer in self.starting.pop(chunk, []):
            answer()


_OUTCOME = {
    Verdict.NO_CHUNK: Outcome.NOT_YET,
    Verdict.BUSY: Outcome.BUSY,
    Verdict.REDIRECT: Outcome.REDIRECTED,
}
"""How the fetcher reads each refusal (the node's replies say the same: no_chunk, busy,
Redirect)."""


_HOLDER_DRAWS = 8
"""Holders of a chunk drawn at random by Swarm._pick_holder, the nearest live one taken
(one holder named per chunk: four, the nearest by name, drew fetchers onto the same busy
holders; standalone, seed 1, the trainers unpublishing: rollouts stalled 18.0 s on
average with none named, 18.2 s with one, 20.9 s with four)."""


def _ticket(t: Hashable) -> int:
    assert isinstance(t, int)
    return t


class Swarm:
    """Fetchers pull (model, version) of ``size`` bytes from ``origins`` and each other."""

    def __init__(
        self,
        engine: Engine,
        net: Network,
        cluster: Cluster,
        size: float,
        origins: list[str],
        fetchers: list[str],
        cfg: SwarmConfig,
        seed: int = 0,
        holders: Sequence[str] = (),
        origin_chunks: dict[str, Sequence[int]] | None = None,
        lagged_before: AbstractSet[str] = frozenset(),
    ) -> None:
        self.e, self.net, self.c, self.cfg = engine, net, cluster, cfg
        # Fetchers whose relay fell behind in the last fetch (the node's lag memory, read
        # from gossip as a fetch begins): each planner is told at its start.
        self.lagged_before = frozenset(lagged_before)
        self._spread_after = cfg.dataplane().spread_after  # (as the node's PeerHandler)
        self.chunk_bytes = size / cfg.chunks
        nic = cluster.spec.nic_gbytes * 1e9 * cluster.spec.efficiency
        # Timers scale with the chunk: the real planner ticks every 10 ms for 4 MiB chunks
        # (a few chunk times); a fixed tick against coarse simulated chunks would time out
        # WAN owners long before a chunk could cross.
        self.tick = cfg.tick or self.chunk_bytes / nic
        # The planner counts non-fetching members as WAN owners while gossip may not yet
        # show who fetches: here a fetcher shows ``hint_delay`` after it begins. (The node
        # keeps its 100 ticks whatever gossip's pace, and a relay link also waits that long
        # for a link that has not begun: with one tick, a link that began a millisecond
        # before the one ahead of it skipped it, and both pulled from the origin; the
        # head check then took the head for slow. sim/fanout.py, the mirror of
        # bench/linerate.py, passes the node's ``member_grace``: docs/results.md, session
        # 32.)
        grace = cfg.member_grace
        if grace is None:
            grace = max(1, math.ceil(cfg.hint_delay / self.tick))
        self.planner_cfg = dataclasses.replace(cfg.planner, member_grace=grace)
        self.rng = random.Random(seed)
        self.nodes: dict[str, _Node] = {}
        self.origins = list(origins)
        self._tickets = 0
        self._issues = 0  # (numbers each sending of a request: _Node.issue)
        # The holder view lists them no more (dead, withdrawn): one frozenset, replaced on a
        # change, so each planner sees the same object and skips it (seen_all_but) until then.
        self._unlisted: frozenset[str] = frozenset()
        self.on_done: Callable[[str], None] | None = None  # called as each fetcher finishes
        self.due_checks = 0  # calls check_due found the planner's memo answering (tests)
        self.on_replicated: Callable[[], None] | None = None  # see when_replicated
        self.timeline: Callable[[str, str, dict[str, object]], None] | None = None
        """Called with (fetcher, event, fields) for each event of a fetch's timeline, in
        the node's ``TENSORHUB_TRACE`` events and fields (``dataplane/trace.py``; no
        ``s`` on "got"), at ``engine.now``: sim/fanout.py writes them as the node does."""
        self._elsewhere = bytearray(cfg.chunks)  # chunks some non-origin holder has whole
        self._elsewhere_left = cfg.chunks
        self._held_by: list[list[str]] = [[] for _ in range(cfg.chunks)]  # whole, ever
        self._leaving: list[str] = []  # withdrew; the holder view drops them (_forget)
        self._with_news: list[str] = []  # fetchers to plan at the next tick (_news)
        n = cfg.chunks

        def slots() -> UploadSlots:
            return UploadSlots(cfg.slots, cfg.max_waiting, cfg.near_waiting, cfg.uploads_per_peer)

        # An origin holds the whole version, or (a sharded trainer) its slice of it.
        self.origin_chunks = {o: list((origin_chunks or {}).get(o, range(n))) for o in origins}
        for o in origins:
            have = bytearray(n)
            for c in self.origin_chunks[o]:
                have[c] = 1
            node = self.nodes[o] = _Node(o, have, slots=slots())
            if cfg.super_seed:
                node.seeder = SuperSeeder(n, cfg.reserve_after, cfg.seed_spare)
        for h in holders:  # complete replicas that are not origins (earlier fetchers)
            self.nodes[h] = _Node(h, bytearray(b"\1" * n), slots=slots())
        for name, node in self.nodes.items():
            for c in range(n):
                if node.have[c]:
                    self._held_by[c].append(name)
        for f in fetchers:
            self.nodes[f] = _Node(f, bytearray(n), slots=slots())
        self.fetchers = list(fetchers)
        # Fetching now, per datacenter: a planner's candidate WAN owners (the real node reads
        # them off the holder view: peers of its DC with a partial copy; one that has not
        # begun, or has finished, is not one).
        self._fetching: dict[int, list[str]] = {}
        self._dc_members: dict[int, int] = {}  # live swarm nodes per datacenter
        self._members: dict[int, list[str]] = {}  # their names, sorted (absent: to be listed)
        for name in self.nodes:
            dc = cluster.hosts[name].dc
            self._dc_members[dc] = self._dc_members.get(dc, 0) + 1
        self._peer_sets(list(holders))

    # -- set-up --------------------------------------------------------------------------------

    def _peer_sets(self, holders: list[str]) -> None:
        """Each fetcher's known sources: origins, complete holders, and ``peers`` fetchers —
        the nearest half by locality, the rest at random (seeded)."""
        cfg = self.cfg
        for f in self.fetchers:
            node = self.nodes[f]
            node.planner_seed = self.rng.random()
            rng = random.Random(node.planner_seed)
            node.planner = ChunkPlanner(f, cfg.chunks, rng, self.planner_cfg)
            session = node.session = FetchSession(node.planner, [] if cfg.record else None)
            if self.lagged_before:
                session.set_lagged_before(self.lagged_before)
            others = [g for g in self.fetchers if g != f]
            rng.shuffle(others)
            others.sort(key=lambda g: self.c.tier(f, g))
            # Our datacenter first (its WAN owners must be visible: as in the real holder
            # view), nearest first; any room left goes to random others.
            dc = self.c.hosts[f].dc
            same = [g for g in others if self.c.hosts[g].dc == dc]
            near = same[: cfg.peers]
            rest = [g for g in others if g not in set(near)]
            peers = near + rng.sample(rest, min(len(rest), cfg.peers - len(near)))
            for o in self.origins:
                session.set_source(o, self.c.tier(f, o), self.origin_chunks[o], True)
            for h in holders:
                session.set_source(h, self.c.tier(f, h), range(cfg.chunks))
            for p in peers:  # (listed as sources once they begin: see _listed)
                self.nodes[p].followers.append(f)

    # -- running -------------------------------------------------------------------------------

    def start(self, at: dict[str, float] | None = None) -> None:
        """Begin every fetch (at its own time if given)."""
        for f in self.fetchers:
            when = (at or {}).get(f, self.e.now)
            self.e.at(when, functools.partial(self._begin, f))

    def begin(self, f: str) -> None:
        """Begin ``f``'s fetch now (a driver that decides each start as it goes)."""
        self._begin(f)

    def _tl(self, f: str, ev: str, **fields: object) -> None:
        if self.timeline is not None:
            self.timeline(f, ev, fields)

    def _begin(self, f: str) -> None:
        self.nodes[f].started = self.e.now
        if self.timeline is not None:
            self._tl(f, "begin", chunks=self.cfg.chunks, held=0, addr=f)
        self._count(f, +1)
        self._pump(f)
        self.e.later(self.cfg.hint_delay, functools.partial(self._listed, f))

    def _listed(self, f: str, lagging: bool = False) -> None:
        """``f`` began its fetch ``hint_delay`` ago: the holder views of those with it in
        their peer set list it now, with what it holds, as the node's holder view lists a
        fetcher once it announced its (empty) replica. Listed from the start instead, a
        fetcher that began a moment late answered "unknown version" as a known source
        (backed off ``gone_ticks``), where the node still takes it for a member that is
        about to begin and waits for it (``ChunkPlanner._not_started``): a relay link
        starting 0.2 ms after its downstream cost the simulated chain 25 % of a copy, and
        none of the namespace runs (bench/linerate.py, links up to 12 ms apart).
        ``lagging``: its relay fell behind, which the node advertises at once
        (Holding.lagging)."""
        node = self.nodes[f]
        if node.dead or node.withdrawn:
            return
        held = [c for c in range(self.cfg.chunks) if node.have[c]]
        for g, other, session in self._fetching_followers(f):
            session.set_source(f, self.c.tier(g, f), held, False, lagging)
            self._news(g, other)

    def _fetching_followers(self, f: str) -> Iterator[tuple[str, _Node, FetchSession]]:
        """Those with ``f`` in their peer set whose fetch is still under way: who hears
        news of ``f`` (that it began, that it holds a chunk)."""
        for g in self.nodes[f].followers:
            other = self.nodes[g]
            if other.session is not None and other.finished is None and not other.dead:
                yield g, other, other.session

    def crash(self, name: str) -> None:
        """Kill a node: its transfers stop, others find out when their requests fail."""
        node = self.nodes[name]
        if node.started is not None and node.finished is None and not node.dead:
            self._count(name, -1)
        if not node.dead and not node.withdrawn:  # (withdrawing already unlisted it)
            self._unlist(name)
        node.dead = True
        for r, t in list(node.inflight.items()):
            if t is not None:
                self.net.cancel(t)
                self._release(r.source, name)  # the sender's slot was ours
        node.inflight.clear()
        node.issue.clear()
        for c in list(node.parked):
            node.settle(c)  # they find it dead
        # What it was sending or had queued stops too; each receiver finds out after the
        # path's delay.
        for f in self.fetchers:
            other = self.nodes[f]
            for r, t in list(other.inflight.items()):
                if r.source == name:
                    if t is not None:
                        self.net.cancel(t)
                    other.inflight[r] = None
                    lost = functools.partial(self._lost, f, r, other.issue.get(r))
                    self.e.later(self.c.latency(name, f), lost)

    def withdraw(self, name: str, drained: Callable[[], None] | None = None) -> None:
        """``name`` lets go of the version, as ``Hub.unpublish`` does (or a fetch of the
        next version into the memory that held it): a new request, or one waiting for an
        upload slot when its turn comes, is answered "unknown version"; the holder view
        lists it no more; uploads under way finish, and then ``drained`` is called (what
        ``unpublish`` returning is: the memory may change)."""
        node = self.nodes[name]
        if node.withdrawn or node.dead:
            raise ValueError(f"{name} holds no replica to withdraw")
        node.withdrawn = True
        node.on_drained = drained
        self._unlist(name)
        if not self._leaving:
            self.e.later(self.cfg.hint_delay, self._forget)
        self._leaving.append(name)
        self._maybe_drained(node)

    def _unlist(self, name: str) -> None:
        """``name`` leaves the holder view (it crashed, or let go of the version): no
        planner lists it from its next tick, and its datacenter counts it out."""
        self._unlisted = self._unlisted | {name}
        dc = self.c.hosts[name].dc
        self._dc_members[dc] -= 1
        self._members.pop(dc, None)

    def _forget(self) -> None:
        """Gossip has carried the withdrawals: every fetcher plans without those holders
        (in the real holder view they are gone), and a chunk none of its known sources
        holds any more is looked for elsewhere (the real view lists every holder; a
        simulated fetcher knows its ``peers``): one live holder of it, as
        :meth:`_pick_holder` finds."""
        gone, self._leaving = self._leaving, []
        for f in self.fetchers:
            node = self.nodes[f]
            session, p = node.session, node.planner
            if session is None or p is None or node.dead or node.finished is not None:
                continue
            known = [g for g in gone if g in p.sources]
            for g in known:
                session.source_gone(g)
            if not known:
                continue
            for c in p.unheld():
                h = self._pick_holder(f, c)
                if h is not None:
                    session.add_chunk(h, c, self.c.tier(f, h))
            if node.started is not None:
                self._news(f, node)

    def _pick_holder(self, f: str, c: int) -> str | None:
        """A live holder of chunk ``c`` for ``f``: the nearest of a few drawn at random
        from those that ever held it whole (at random: by name, every fetcher herded onto
        the same few), or of all of them if none of those is live."""
        everyone = self._held_by[c]
        if not everyone:
            return None

        def usable(g: str) -> bool:
            node = self.nodes[g]
            return g != f and not node.dead and not node.withdrawn

        draws = [everyone[self.rng.randrange(len(everyone))] for _ in range(_HOLDER_DRAWS)]
        pool = [g for g in draws if usable(g)] or [g for g in everyone if usable(g)]
        return min(pool, key=lambda g: self.c.tier(f, g), default=None)

    def _maybe_drained(self, node: _Node) -> None:
        if node.on_drained is not None and not node.slots.active and not node.slots.waiting:
            done, node.on_drained = node.on_drained, None
            done()

    def when_replicated(self, then: Callable[[], None]) -> None:
        """Call ``then`` once every chunk is held whole by some node that is not an origin
        (``Hub.wait_replicated``: one full copy exists elsewhere), now if it already is.
        One waiter at a time (the trainers' release is the only one)."""
        if not self._elsewhere_left:
            then()
        elif self.on_replicated is not None:
            raise ValueError("already waiting for the first full copy elsewhere")
        else:
            self.on_replicated = then

    def _lost(self, f: str, r: Request, n: int | None) -> None:
        self._failed(f, r, Outcome.LOST, n=n)

    @property
    def laggards(self) -> frozenset[str]:
        """Fetchers that finished with their relay fallen behind (what each keeps as its
        lag memory, as the node does once its replica is whole: the next fetch's
        ``lagged_before``)."""
        return frozenset(
            f
            for f in self.fetchers
            if (node := self.nodes[f]).finished is not None
            and node.planner is not None
            and node.planner.lagging
        )

    @property
    def done(self) -> bool:
        return all(self.nodes[f].finished is not None or self.nodes[f].dead for f in self.fetchers)

    def completion(self) -> float:
        return max(
            (n.finished or 0.0) - (n.started or 0.0)
            for n in map(self.nodes.get, self.fetchers)
            if n and not n.dead
        )

    def _pump(self, f: str) -> None:
        node = self.nodes[f]
        p, session = node.planner, node.session
        if node.dead or p is None or session is None or node.started is None:
            return
        if node.finished is not None:
            return  # (a peer's announcement must not start a fetch before its time)
        if (tick := int(self.e.now / self.tick)) > p.now:  # (advancing to now is a no-op)
            session.advance(tick)
        if node.seen_tick != p.now:  # (within a tick, seeing them again changes nothing)
            node.seen_tick = p.now
            session.seen_all_but(self._unlisted)  # the holder view (a crash is seen at once)
        if self.cfg.check_due:
            self.due_checks += check_quiet_until_due(p)
        self._perform(f, session.requests(self.e.now))
        if self.timeline is not None and p.relay_upstream != node.traced_up:
            node.traced_up = p.relay_upstream
            self._tl(
                f,
                "upstream",
                to=node.traced_up,
                held=p.held,
                passed=p.passed_over(),
                before=p.links_before,
                lost=p.lost_sources(),
                **p.chain_inputs(),
            )
        if p.lagging and not node.lagging:
            node.lag(self.cfg.cut_through)
            refused = self._refuse_queued(f)
            if self.timeline is not None:
                held = p.held
                up = p.relay_upstream
                self._tl(f, "lagging", held=held, up=up, refused=refused, paced=p.paced)
            self.e.later(self.cfg.hint_delay, functools.partial(self._listed, f, lagging=True))
        if not node.inflight:
            self._wake_later(f)
        self._wake_when_due(f, p.now + 1 if self.cfg.check_due else max(p.next_due(), p.now + 1))

    def _wake_when_due(self, f: str, due: int) -> None:
        """Plan again at tick ``due`` (the planner's next_due, past the tick we are in), as
        the node's fetch loop does: it wakes every tick, and the calls before that tick
        the planner answers from its memo. Without it a fetch with requests in flight
        planned only at its next event, and a decision the clock brings (a wait for a
        link run out, a lag look, a back-off ended) waited for the next chunk to land."""
        node = self.nodes[f]
        if due >= NEVER or 0 <= node.due_wake <= due:
            return  # (never, or a wake set for that tick or sooner plans again then)
        node.due_wake = due

        def wake() -> None:
            if node.due_wake == due:
                node.due_wake = -1
            self._pump(f)

        self.e.at((due + 1e-6) * self.tick, wake)  # (past the tick: float rounding)

    def _wake_later(self, f: str, ticks: int = 2) -> None:
        node = self.nodes[f]
        if not node.wake_pending:
            node.wake_pending = True

            def wake() -> None:
                node.wake_pending = False
                self._pump(f)

            self.e.later(ticks * self.tick, wake)

    def _serve(self, s: str, f: str, r: Request, n: int) -> None:
        src, c = self.nodes[s], r.chunk
        back = self.c.latency(s, f)
        if src.dead:  # the connection breaks
            self.e.later(back, lambda: self._failed(f, r, Outcome.LOST, n=n))
            return
        if src.withdrawn:
            self._refuse_withdrawn(f, r, back, n)
            return
        hosts = self.c.hosts
        src.seeder = holder_seeder(src.seeder, self.cfg.chunks, self._spread_after)

        def seed() -> SeedDecision:
            assert src.seeder is not None
            ctx = past_laggards(
                seed_context(
                    hosts[s].dc,
                    hosts[f].dc,
                    lambda: self._dc_members.get(hosts[s].dc, 0) > 1,
                    lambda g: hosts[g].dc,
                    self._alive,
                ),
                self.nodes[f].lagging,
                lambda g: self.nodes[g].lagging or g in src.laggards,
            )
            return src.seeder.decide(
                c,
                f,
                self.e.now,
                remote=ctx.remote,
                local_busy=ctx.local_busy,
                alive=ctx.can_pass_on,
                behind=ctx.behind,
                spare=src.slots.has_spare(),
            )

        if src.started is None and not any(src.have):
            # As the node: one that has not begun its fetch holds no replica of the version
            # ("unknown version"), which a relay's downstream reads as a link not started.
            self.e.later(back, lambda: self._failed(f, r, Outcome.WITHDRAWN, n=n))
            return
        cut = self.cfg.cut_through
        # (Nor may s pass on bytes that f itself is passing to it: once their real source
        # died, the two would wait on each other for ever.)
        landing = cut and not src.have[c] and src.receiving(c) and not self._feeds(f, s, c)
        d = serve_decision(
            have=bool(src.have[c]),
            incoming=landing if cut and self.cfg.early_hints else src.requested(c, f),
            admit=lambda: src.slots.admit(near=self.c.tier(s, f) <= SAME_RACK),
            seed=seed if src.seeder is not None else None,
            cut_through=cut,
            landing=landing,
            lagging=src.lagging,
            asker_lagging=self.nodes[f].lagging,
            # (As the node: not once s asked anyone for it, f included.)
            starting=self.cfg.park_starting
            and src.starting_fetch(c)
            and not any(q.chunk == c for q in src.inflight),
        )
        if d.verdict is Verdict.PARK:  # answer once it lands (cut through) or has arrived
            (src.starting if cut else src.parked).setdefault(c, []).append(
                lambda: self._serve(s, f, r, n)
            )
            return
        if d.verdict is not Verdict.SERVE:
            outcome = _OUTCOME[d.verdict]
            self.e.later(back, lambda: self._failed(f, r, outcome, d.holders, n=n))
            return
        asker = self.nodes[f].planner
        if src.seeder is not None and (asker is None or asker.onward(r)):
            src.seeder.sent(c, f, self.e.now)
        self._tickets += 1
        ticket = self._tickets

        if src.slots.request(f, ticket):
            self._upload(s, f, r, back, n)
        else:
            src.queued[ticket] = _Queued(f, r, back, n)

    def _refuse_queued(self, s: str) -> int:
        """As the node's ``PeerHandler.refuse_queued``: ``s`` fell behind, and the uploads
        queued here for askers that do not lag are answered "busy" now. How many."""
        src = self.nodes[s]
        refused = 0
        for ticket, q in list(src.queued.items()):
            if self.nodes[q.asker].lagging:
                continue
            refused += 1
            del src.queued[ticket]
            src.slots.cancel(q.asker, ticket)
            if src.seeder is not None:
                src.seeder.unsent(q.request.chunk, q.asker)
            busy = functools.partial(self._failed, q.asker, q.request, Outcome.BUSY, n=q.sending)
            self.e.later(q.back, busy)
        return refused

    def _upload(self, s: str, f: str, r: Request, back: float, n: int) -> None:
        """``s`` has an upload slot for ``f``'s request ``r``: start its bytes (with the
        reply's latency), unless one of them is gone or ``s`` let go while it waited."""
        src, c = self.nodes[s], r.chunk
        if src.dead or src.withdrawn or self.nodes[f].dead:
            self._release(s, f)
            if src.withdrawn:  # it let go while the request waited for a slot
                self._refuse_withdrawn(f, r, back, n)
            return
        if self.nodes[f].issue.get(r) != n:
            # Abandoned while queued here: the node's Cancel reached us first, so its
            # bytes never go, and we count the asker no recipient of the chunk.
            self._release(s, f)
            if src.seeder is not None:
                src.seeder.unsent(c, f)
            return
        feed = None  # cutting through: the transfer bringing c to s paces ours
        if not src.have[c]:
            feed = next((t for q, t in src.inflight.items() if q.chunk == c and t), None)
        t = self.net.start(
            self.c.path(s, f),
            self.chunk_bytes,
            lambda: self._delivered(s, f, r, n),
            latency=back,
            tag=f"{s}>{f}",
            upstream=feed,
            line=(s, f),  # one connection per pair: its chunks move one at a time
        )
        fetcher = self.nodes[f]
        fetcher.inflight[r] = t
        if fetcher.session is not None:
            fetcher.session.receiving(r, self.e.now)
        if self.cfg.cut_through and not fetcher.have[c]:
            if self.cfg.early_hints:
                self.e.later(self.cfg.hint_delay, lambda: self._announce(f, c))
            fetcher.landing(c)

    def _refuse_withdrawn(self, f: str, r: Request, back: float, n: int) -> None:
        """Answer "unknown version" (a request sent before the withdrawal reached ``f``),
        naming a live holder of the chunk, as :meth:`_forget` does: the real holder view
        lists every holder of the version, where a simulated fetcher knows only its
        ``peers``, so once the origins let go a chunk could be out of sight of a whole
        datacenter's fetchers (a livelock: cross-DC, seed 1)."""
        h = self._pick_holder(f, r.chunk)
        found = (h,) if h is not None else ()
        self.e.later(back, lambda: self._failed(f, r, Outcome.WITHDRAWN, found, n=n))

    def _feeds(self, f: str, s: str, c: int) -> bool:
        """Do ``s``'s bytes of chunk ``c`` come, through a chain of cut-through requests,
        from ``f``? (The real node serves only verified chunks, so it has no such chain;
        the simulated one hints a coarse chunk as soon as it starts arriving.)"""
        seen, todo = {s}, [s]
        while todo:
            for q in self.nodes[todo.pop()].inflight:
                if q.chunk == c and q.source not in seen:
                    if q.source == f:
                        return True
                    seen.add(q.source)
                    todo.append(q.source)
        return False

    def _count(self, f: str, delta: int) -> None:
        dc = self.c.hosts[f].dc
        active = self._fetching.setdefault(dc, [])
        if delta > 0:
            active.append(f)
        else:
            active.remove(f)
        # As the node: our datacenter's fetchers, and its other live members (gossip learns
        # who fetches too late for fetchers alone to be the candidate WAN owners): one view
        # for all of them, built once here.
        members = self._members.get(dc)
        if members is None:
            members = self._members[dc] = sorted(
                n
                for n, node in self.nodes.items()
                if not node.dead and not node.withdrawn and self.c.hosts[n].dc == dc
            )
        view = DcView.of(active, members)
        for g in active:
            session = self.nodes[g].session
            if session is not None and session.set_dc_view(view) and g != f:
                self._pump(g)  # turns changed: a chunk it waited on may be its own now

    def _alive(self, name: str) -> bool:
        return name in self.nodes and not self.nodes[name].dead and not self.nodes[name].withdrawn

    def _release(self, s: str, peer: str) -> None:
        """An upload from ``s`` to ``peer`` ended (delivered, cancelled, or moot)."""
        src = self.nodes[s]
        for _peer, ticket in src.slots.release(peer):
            q = src.queued.pop(_ticket(ticket))
            self._upload(s, q.asker, q.request, q.back, q.sending)
        if src.withdrawn:
            self._maybe_drained(src)

    def _settle(self, f: str, r: Request, n: int | None) -> FetchSession | None:
        """The reply to ``r`` (its sending ``n``, see _Node.issue) arrived at ``f``: its
        fetch session, if the request still matters."""
        node = self.nodes[f]
        if node.dead or r not in node.inflight or node.issue.get(r) != n:
            return None  # f died, or abandoned r (an endgame loser still delivered)
        del node.inflight[r]
        del node.issue[r]
        return node.session

    def _perform(self, f: str, actions: list[Action]) -> None:
        """Play a fetch session's actions on the simulated network."""
        node = self.nodes[f]
        for a in actions:
            if isinstance(a, Send):
                r = a.request
                if self.timeline is not None:
                    self._tl(f, "ask", chunk=r.chunk, src=r.source, dup=r.duplicate)
                node.inflight[r] = None
                self._issues += 1
                node.issue[r] = self._issues
                serve = functools.partial(self._serve, r.source, f, r, self._issues)
                self.e.later(self.c.latency(f, r.source), serve)
            elif isinstance(a, Abandon):
                node.issue.pop(a.request, None)
                t = node.inflight.pop(a.request, None)
                if t is not None:
                    self.net.cancel(t)
                    self._release(a.request.source, f)
            elif isinstance(a, Settle):
                node.settle(a.chunk)  # who waited for it here: it is in, or not coming yet
            elif isinstance(a, Behind):
                self.e.later(self.c.latency(f, a.source), functools.partial(self._behind, a.source))
                for o in self.origins:  # (the node's Behind.who: it sends no one to the head)
                    self.e.later(self.c.latency(f, o), functools.partial(self._told, o, a.source))

    def _told(self, origin: str, head: str) -> None:
        """``origin`` hears that ``head`` is a slow chain head (Behind.who)."""
        self.nodes[origin].laggards.add(head)

    def _behind(self, s: str) -> None:
        """``s`` hears that it is a slow chain head (the node's ``Behind`` message)."""
        node = self.nodes[s]
        live = node.session is not None and node.finished is None and not node.dead
        if live and node.session is not None and node.session.told_behind():
            self._pump(s)

    def _delivered(self, s: str, f: str, r: Request, n: int) -> None:
        self._release(s, f)
        src = self.nodes[s]
        src.last_sent = self.e.now
        if src.dead and not src.have[r.chunk]:
            self._failed(f, r, Outcome.LOST, n=n)  # it died before the rest reached it
            return
        if not src.have[r.chunk]:
            if not any(q.chunk == r.chunk for q in src.inflight):
                # s lost its source before we caught up (our flow outran a cancelled
                # upstream): nothing will settle the chunk at s, so do not wait for it.
                self._failed(f, r, Outcome.NOT_YET, n=n)
                return
            # Cut through: our bytes are here, the rest of the chunk is still on its way to
            # s; the request stays in flight (no flow, no slot) until s has it all.
            node = self.nodes[f]
            if not node.dead and node.issue.get(r) == n:
                node.inflight[r] = None
                src.parked.setdefault(r.chunk, []).append(lambda: self._upstream(s, f, r, n))
            return
        self._arrived(s, f, r, n)

    def _upstream(self, s: str, f: str, r: Request, n: int) -> None:
        """The chunk ``f`` cut through from ``s`` settled at ``s``: complete, or lost."""
        src = self.nodes[s]
        if src.have[r.chunk]:
            self._arrived(s, f, r, n)
        else:  # s lost it (died, or its own source failed): so did f
            self._failed(f, r, Outcome.LOST if src.dead else Outcome.NOT_YET, n=n)

    def _arrived(self, s: str, f: str, r: Request, n: int) -> None:
        session = self._settle(f, r, n)
        if session is None:
            return
        node = self.nodes[f]
        first = not node.have[r.chunk]
        node.mark(r.chunk, self.cfg.cut_through)  # (before Settle wakes who waited for it here)
        self._perform(f, session.verified(r))
        if first:
            self.e.trace("chunk", f, r.chunk, s)
            if self.timeline is not None:
                self._tl(f, "got", chunk=r.chunk, src=s)
            self._held_by[r.chunk].append(f)
            if not self._elsewhere[r.chunk]:
                self._elsewhere[r.chunk] = 1
                self._elsewhere_left -= 1
                if not self._elsewhere_left and self.on_replicated is not None:
                    then, self.on_replicated = self.on_replicated, None
                    then()
            self.e.later(self.cfg.hint_delay, lambda: self._announce(f, r.chunk))
        if session.planner.done and node.finished is None:
            node.finished = self.e.now
            self._count(f, -1)
            self.e.trace("done", f)
            if self.timeline is not None:
                self._tl(f, "end", held=session.planner.num_chunks, error=None)
            if self.on_done is not None:
                self.on_done(f)
            return
        self._pump(f)

    def _announce(self, f: str, chunk: int) -> None:
        for g, other, session in self._fetching_followers(f):
            session.add_chunk(f, chunk)
            self._news(g, other)

    def _news(self, g: str, node: _Node) -> None:
        """A peer's news reached ``g``: plan again at the next tick, as the node does. Its
        fetch loop takes a peer's Have into the session when it comes but plans only when
        a request completes or a tick passes (``dataplane/swarm.py`` ``_fetch_loop``), so
        news that comes before either is planned with it. Planning on every announcement
        was a pump per follower per chunk, most of them finding nothing new to ask (a
        quarter of a 10,240-GPU run). One event plans every fetcher with news, in the
        order their news came."""
        if node.news_pending:
            return
        node.news_pending = True
        self._with_news.append(g)
        if len(self._with_news) == 1:
            self.e.at((math.floor(self.e.now / self.tick) + 1) * self.tick, self._plan_news)

    def _plan_news(self) -> None:
        batch, self._with_news = self._with_news, []
        for g in batch:
            self.nodes[g].news_pending = False
            self._pump(g)

    def _failed(
        self,
        f: str,
        r: Request,
        outcome: Outcome,
        holders: tuple[str, ...] = (),
        *,
        n: int | None,
    ) -> None:
        """``f``'s request ``r`` (its sending ``n``: _Node.issue) ended without its chunk;
        a stale sending's end is dropped."""
        session = self._settle(f, r, n)
        if session is None:
            return
        if self.timeline is not None:
            self._tl(f, "failed", chunk=r.chunk, src=r.source, why=outcome.name)
        found = [(h, self.c.tier(f, h)) for h in holders if h != f and h in self.nodes]
        self._perform(f, session.failed(r, outcome, found))
        self._pump(f)
        self._wake_later(f)

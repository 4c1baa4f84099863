"""Fetching one version from many holders at once, scheduled by the ChunkPlanner.

The fetcher's replica joins the local store as soon as the manifest is in, so every chunk
it verifies is served onward at once (partial-prefix serving): replication pipelines
instead of waiting for whole copies. Failures are the planner's inputs: a holder that
vanishes is dropped and its chunks go back to the pool; a corrupt chunk strikes its source
(banned after repeated strikes) and is fetched again elsewhere; a holder that lacks a
chunk (not verified yet, or a stale hint) is asked again later or of others; an origin
that already sent a chunk out redirects us to the nodes it sent it to. The fetch ends with
every byte verified, or with TransferError once no usable holder is left for some chunk.

Endgame: when every missing chunk is in flight, the last ones are asked of a second
holder too. A duplicate lands in scratch memory; the first verified copy wins, and the
others are abandoned *synchronously* (the rest of their payload is diverted to scratch),
so no late or corrupt copy ever writes into the destination after a chunk was verified.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from ..core.errors import (
    ChecksumMismatch,
    ManifestError,
    Refused,
    RemoteError,
    TensorHubError,
    TransferError,
    UnknownVersion,
)
from ..core.gossip.membership import Status
from ..core.histogram import CHUNK_BUCKETS, Histogram
from ..core.manifest import Manifest
from ..core.naming import ShardKey, display_name
from ..core.swarm import ChunkPlanner, PlannerConfig, Request
from ..core.swarm.presets import NODE
from ..core.swarm.session import Abandon, Action, Behind, FetchSession, Input, Outcome, Send
from ..io.tensors import TensorBytes, copy_chunk
from .fetch import FetchResult
from .node import Node
from .peer import PeerHandler
from .store import Replica
from .trace import FetchTrace
from .view import ClusterView, Holder, SourceNews

__all__ = ["Holder", "NoManifest", "fetch_manifest", "copy_held", "swarm_fetch", "swarm_fill"]

log = logging.getLogger(__name__)

SWARM_CONFIG = NODE.planner

SLOW_FETCH_RATE = 100e6
"""Bytes/s under which a finished fetch is logged as slow (with its causes): about a
1 Gbit/s NIC's rate. A fixed time (1 s) warned on every fetch of a large model."""


def slow_after(nbytes: int) -> float:
    """Seconds after which a fetch of ``nbytes`` counts as slow (never under 1 s)."""
    return max(1.0, nbytes / SLOW_FETCH_RATE)


TICK = 0.01

STALL_TICKS = 5
"""A fetch loop that did not run for more than this many ticks (it runs every tick) was
stalled: its process had no CPU, or a callback held the event loop. The planner is told
(FetchSession.stalled): a relay link's gap to its upstream grew while it did not run, not
because its NIC is slow."""
MOVED_ON_STALL = 2.0
"""Seconds a fetch waits with no chunk verified and nothing in flight, when its version has
been superseded (``superseded()`` says so) and no holder answered "busy" or "redirected",
before it fails: its holders let go of it for the newer version (the mutability
contract) and none is left to ask. The stall bound for the latest version
(``stall_timeout``, 10 s) cost a launch's dc2 rollouts 10 s of stall on a v1 whose WAN
sender was killed and whose other holders had fetched v2 into the same memory; v2 came
and went meanwhile (tests/test_launch.py, 2 runs in 8 under two busy loops). Long enough
for several gossip rounds: a holder gossip had not yet told us of is heard of."""
SUSPECT_TICKS = 10
"""A suspect source is asked for nothing new for this many ticks, renewed while gossip
still suspects it (suspicion clears without news when the member refutes it)."""


class NoManifest(TransferError):
    """None of the hinted holders could give the manifest (all hints stale or unreachable)."""


async def fetch_manifest(
    node: Node, holders: list[Holder], key: ShardKey, version: int, expected_root: bytes | None
) -> Manifest:
    errors = []
    for h in sorted(holders, key=lambda h: h.tier):
        try:
            peer = await node.peer(h.addr)
            return await peer.get_manifest(key, version, expected_root)
        except (TensorHubError, OSError) as e:
            errors.append(f"{h.addr}: {e}")
    raise NoManifest(f"no holder gave the manifest of {display_name(key)} v{version}: {errors}")


async def swarm_fetch(
    node: Node,
    key: ShardKey,
    version: int,
    into: Mapping[str, torch.Tensor],
    holders: list[Holder],
    *,
    expected_root: bytes | None = None,
    config: PlannerConfig | None = None,
    stall_timeout: float = 10.0,
    on_chunk: Callable[[Replica, int], None] | None = None,
    # called with -1 once the replica exists, then with each chunk as it is verified
    seed: int | None = None,
    view: ClusterView | None = None,
    request_timeout: float = 10.0,
    timeout: float | None = None,
    record: list[Input] | None = None,
    superseded: Callable[[], bool] | None = None,
) -> FetchResult:
    """Fetch (key, version) into ``into`` from ``holders``; serve it while fetching.

    ``view`` (by default the node's) tells the fetch of its sources as events: what it
    knows when the fetch starts, then each change (a holder appearing or growing — other
    fetchers' partial replicas become sources —, members turning suspect or dead, who in
    our datacenter fetches too). A source gossip declared dead is dropped and its requests
    in flight are reissued elsewhere at once (a hung process keeps its TCP connections
    open, so nothing else would tell us before ``request_timeout``); a suspect one gets no
    new requests while suspected. ``timeout``: seconds for the whole fetch, after which it
    fails with a TransferError saying what was missing and why; so does a fetch that made
    no progress for ``stall_timeout`` seconds, or for ``MOVED_ON_STALL`` where
    ``superseded()`` says a newer version replaced this one. ``record``: a list to
    append the fetch session's inputs to (:func:`~tensorhub.core.swarm.session.replay`
    replays them)."""
    t0 = time.perf_counter()
    local = _held(node, key, version)
    if local is not None:
        return await _copy_local(local, key, version, into, expected_root, t0)
    manifest = await fetch_manifest(node, holders, key, version, expected_root)
    replica = Replica(key, version, manifest, TensorBytes.for_destination(manifest, into))
    return await swarm_fill(
        node,
        replica,
        holders,
        started=t0,
        config=config,
        stall_timeout=stall_timeout,
        on_chunk=on_chunk,
        seed=seed,
        view=view,
        request_timeout=request_timeout,
        timeout=timeout,
        record=record,
        superseded=superseded,
    )


async def swarm_fill(
    node: Node,
    replica: Replica,
    holders: list[Holder],
    *,
    serve: bool = True,
    started: float | None = None,
    config: PlannerConfig | None = None,
    stall_timeout: float = 10.0,
    on_chunk: Callable[[Replica, int], None] | None = None,
    seed: int | None = None,
    view: ClusterView | None = None,
    request_timeout: float = 10.0,
    timeout: float | None = None,
    record: list[Input] | None = None,
    superseded: Callable[[], bool] | None = None,
) -> FetchResult:
    """Fill every chunk ``replica`` lacks from the swarm (see :func:`swarm_fetch`).

    ``serve=False`` reads without becoming a source: the replica is not put in the store
    and no peer hears of its chunks. Partial reads (a stream's bucket, a tensor-parallel
    rank's slice) use it: their memory is reused or holds a fraction of the version, so
    it could not go on serving. Chunks already marked in ``replica.have`` are not fetched.
    ``started``: when the caller began (it fetched the manifest), for the timings."""
    key, version, manifest = replica.key, replica.version, replica.manifest
    t0 = time.perf_counter() if started is None else started
    t1 = time.perf_counter()
    replica.onward = serve  # holders hear it: an origin does not redirect others to us
    if serve:
        node.store.add(replica)  # partial: serves each chunk once verified
    if on_chunk is not None:
        on_chunk(replica, -1)  # announce the (empty) replica: we are a fetcher of this version
    config = config or node.dataplane.planner
    have = [c for c, h in enumerate(replica.have) if h]
    planner = ChunkPlanner(node.address, manifest.num_chunks, random.Random(seed), config, have)
    session = FetchSession(planner, record)
    view = view or node.view
    trace = FetchTrace.open(node.name, key, version)
    driver = _Driver(node, replica, session, view, announce=serve, trace=trace)
    if trace is not None:
        trace.event("begin", chunks=manifest.num_chunks, held=len(have), addr=node.address)
    _use(session, holders)
    if lagged := view.lagged_before(key):  # (once: see set_lagged_before)
        session.set_lagged_before(lagged)
    if trace is not None:
        trace.event("lagged_before", names=sorted(lagged))
    news: list[SourceNews] = [view.sources(key, version)]
    unwatch = view.watch_sources(key, version, news.append)

    def seen(addr: str, chunks: list[int]) -> None:  # a peer's Have: faster than gossip
        session.add_chunks(addr, chunks)

    unhave = node.watch_haves(key, version, seen)
    unbehind = node.watch_behind(key, version, driver.told_behind)
    try:
        await _fetch_loop(
            driver,
            news,
            on_chunk=on_chunk,
            stall_timeout=stall_timeout,
            request_timeout=request_timeout,
            timeout=timeout,
            superseded=superseded,
        )
        await driver.settled()
        replica.data.finalize()
    except BaseException as e:
        driver.perform(session.abandon_all())  # nothing may write into the caller's tensors
        await asyncio.shield(driver.settled())
        if serve:
            node.store.remove(key, version)  # never leave a broken replica advertised
        if trace is not None:
            trace.event("end", held=planner.held, error=repr(e))
        raise
    else:
        if trace is not None:
            trace.event("end", held=planner.num_chunks, error=None)
    finally:
        unwatch()
        unhave()
        unbehind()
        if trace is not None:
            trace.close()
    t2 = time.perf_counter()
    fetched = manifest.total_bytes - sum(manifest.layout.chunk_len(c) for c in have)
    if t2 - t0 > slow_after(fetched):
        log.warning(
            "%s: fetch of %s v%d took %.1fs, slower than %.0f MB/s (manifest %.1fs; failed "
            "requests: %s; WAN requests %d; sources %s)",
            node.name,
            display_name(key),
            version,
            t2 - t0,
            SLOW_FETCH_RATE / 1e6,
            t1 - t0,
            dict(session.trouble) or "none",
            planner.wan_requests,
            sorted((s.tier, n) for n, s in planner.sources.items()),
        )
    return FetchResult(
        key,
        version,
        manifest,
        fetched,
        manifest.num_chunks - len(have),
        t2 - t0,
        t1 - t0,
        dict(session.trouble),
        dict(driver.received),
        driver.chunk_seconds,
    )


def _use(session: FetchSession, holders: Iterable[Holder]) -> None:
    for h in holders:
        session.set_source(h.addr, h.tier, h.chunks, h.origin, h.lagging)


def _apply(session: FetchSession, driver: _Driver, news: SourceNews) -> None:
    """One piece of source news, into the session."""
    _use(session, news.holders)
    for name in news.gone:
        if name in session.planner.sources:
            session.source_gone(name)
    if news.dc_fetchers is not None:
        session.set_dc_fetchers(news.dc_fetchers, news.dc_members or ())
    if news.health is not None:
        for name in list(session.planner.sources):
            status = news.health.get(name)
            if status is Status.DEAD:
                driver.perform(session.source_dead(name, time.monotonic()))
            elif status is Status.SUSPECT:
                driver.suspects.add(name)
            elif status is not None:
                driver.suspects.discard(name)
        _suspend(session, driver.suspects, time.monotonic())


def _suspend(session: FetchSession, suspects: set[str], now: float) -> None:
    """Ask suspects for nothing new for a while, unless every source is suspect (under
    load, suspicion of a live node is common: the fetch would only stall), or one is
    sending to us now (:meth:`FetchSession.heard_from`)."""
    sources = session.planner.sources
    live = [n for n in suspects if n in sources and not session.heard_from(n, now)]
    if len(live) < len(sources):
        for name in live:
            session.suspend(name, SUSPECT_TICKS)


async def _fetch_loop(
    driver: _Driver,
    news: list[SourceNews],
    *,
    on_chunk: Callable[[Replica, int], None] | None,
    stall_timeout: float,
    request_timeout: float,
    timeout: float | None,
    superseded: Callable[[], bool] | None = None,
) -> None:
    """Take news, issue, wait, tell the session, until every chunk is verified (or it is
    stuck)."""
    session, planner, replica = driver.session, driver.session.planner, driver.replica
    key, version = replica.key, replica.version
    t_ticks = last_progress = time.monotonic()
    deadline = None if timeout is None else t_ticks + timeout
    ran = [planner.now]  # the tick we last ran at

    def clock() -> None:
        """Advance the planner's ticks with wall time (TICK each); apply news."""
        now = int((time.monotonic() - t_ticks) / TICK)
        if now - ran[0] > STALL_TICKS:
            session.stalled()
            if driver.trace is not None:
                driver.trace.event("stalled", ticks=now - ran[0], held=planner.held)
        ran[0] = now
        if session.advance(now, SUSPECT_TICKS):
            _suspend(session, driver.suspects, time.monotonic())  # still suspected: renew
        while news:
            _apply(session, driver, news.pop(0))

    clock()
    held_off = HeldOff(since=t_ticks)
    while not planner.done:
        driver.perform(session.requests(time.monotonic()))
        if deadline is not None and time.monotonic() > deadline:
            raise _stuck(planner, key, version, session.trouble, f"not done after {timeout}s")
        if not driver.running:
            now = time.monotonic()
            idle = now - last_progress
            if idle > stall_timeout:
                raise _stuck(planner, key, version, session.trouble)
            if superseded_and_stalled(session, held_off, now, idle, superseded):
                why = f"superseded (a newer version is committed), no progress for {idle:.1f}s"
                raise _stuck(planner, key, version, session.trouble, why)
            await asyncio.sleep(TICK)
            clock()
            continue
        done, _ = await asyncio.wait(
            driver.running, timeout=TICK, return_when=asyncio.FIRST_COMPLETED
        )
        clock()
        driver.perform(session.expire(time.monotonic(), request_timeout))
        await driver.settled()  # before another copy of a timed-out chunk can land
        for task in done:
            chunk = await driver.completed(task)
            if chunk is not None:
                last_progress = time.monotonic()
                # Tell the version's swarm at once: the fetchers among our sources, and
                # whoever asked us for it.
                if driver.announce:
                    partial = [n for n, s in planner.sources.items() if n not in planner.full]
                    driver.node.announce(key, version, chunk, partial)
                if on_chunk is not None:
                    on_chunk(replica, chunk)


@dataclass
class HeldOff:
    """The "busy" and "redirected" answers a fetch has had from holders, and when their
    count last grew (see :func:`superseded_and_stalled`)."""

    answers: int = 0
    since: float = 0.0


def superseded_and_stalled(
    session: FetchSession,
    held_off: HeldOff,
    now: float,
    idle: float,
    superseded: Callable[[], bool] | None,
) -> bool:
    """Give up on a superseded version (``MOVED_ON_STALL``)? Not while a holder answers
    "busy" or "redirected" (it, or those it points to, hold what we lack: a retained old
    version that many fetch at once), only once ``idle`` and that silence both last
    ``MOVED_ON_STALL``."""
    answers = session.trouble["busy"] + session.trouble["redirected"]
    if answers != held_off.answers:
        held_off.answers, held_off.since = answers, now
    quiet = now - held_off.since
    return (
        idle > MOVED_ON_STALL and quiet > MOVED_ON_STALL and superseded is not None and superseded()
    )


def _stuck(
    planner: ChunkPlanner, key: ShardKey, version: int, trouble: Counter[str], why: str = ""
) -> TensorHubError:
    """The error for a fetch that can make no more progress (or ran out of time):
    ChecksumMismatch if every holder of a missing chunk sent corrupt data (retries
    exhausted), else TransferError."""
    missing = planner.missing()
    holders = {n for n, s in planner.sources.items() if any(c in s.chunks for c in missing)}
    lead = f"{why}, " if why else ""
    what = f"{display_name(key)} v{version}: {lead}chunks {missing[:8]} (of {len(missing)} missing)"
    if holders and all(planner.sources[n].strikes for n in holders):
        return ChecksumMismatch(
            f"{what}: every holder of them sent bytes that do not match the published "
            f"digests ({trouble['corrupt']} replies from {sorted(holders)[:4]}). The usual "
            "cause: the publisher changed its tensors (an optimizer step) before "
            "unpublish() returned, so the version it serves is no longer the one it published"
        )
    hint = ""
    if not holders and trouble["withdrawn"]:
        hint = " (its holders let go of it: a newer version may have replaced it in their memory)"
    return TransferError(
        f"{what}: no usable holder{hint} ({dict(trouble)}; {sorted(planner.sources)})"
    )


def _held(node: Node, key: ShardKey, version: int) -> Replica | None:
    try:
        return node.store.get(key, version)
    except UnknownVersion:
        return None


async def _copy_local(
    replica: Replica,
    key: ShardKey,
    version: int,
    into: Mapping[str, torch.Tensor],
    expected_root: bytes | None,
    t0: float,
) -> FetchResult:
    """This node already holds the version: copy it, verified, without the network."""
    m = replica.manifest
    if expected_root is not None and m.root != expected_root:
        raise ManifestError(
            f"{display_name(key)} v{version} held here has root {m.root.hex()}, "
            f"not the expected {expected_root.hex()}"
        )
    if not replica.complete:
        raise TransferError(
            f"a fetch of {display_name(key)} v{version} is already in progress here"
        )
    dest = Replica(key, version, m, TensorBytes.for_destination(m, into))
    return await copy_held(replica, dest, started=t0)


async def copy_held(local: Replica, replica: Replica, started: float | None = None) -> FetchResult:
    """Fill ``replica``'s missing chunks from ``local``, a complete replica of the same
    version held here, each copy checked against the manifest (no network).

    The copies and their checks run in a thread: a model's worth of memory copied and
    hashed holds an event loop for seconds, longer than gossip waits before it takes a
    silent node for dead. ``local`` counts as read meanwhile, so an unpublish of it waits
    for the copy (``Replica.drained``) before the caller may change its memory."""
    t0 = time.perf_counter() if started is None else started
    m = replica.manifest
    todo = [c for c, had in enumerate(replica.have) if not had]

    def copy() -> int | None:
        for c in todo:
            if not copy_chunk(local.data, replica.data, m, c):
                return c
        return None

    local.begin_read()
    try:
        bad = await asyncio.to_thread(copy)
    finally:
        local.end_read()
    if bad is not None:
        raise ChecksumMismatch(
            f"chunk {bad} of {display_name(replica.key)} v{replica.version} changed in memory here"
        )
    for c in todo:
        replica.mark(c)
    replica.data.finalize()
    n = sum(m.layout.chunk_len(c) for c in todo)
    return FetchResult(replica.key, replica.version, m, n, len(todo), time.perf_counter() - t0, 0.0)


class _Driver:
    """The asyncio side of one fetch: performs its :class:`FetchSession`'s actions on real
    connections and turns each finished request back into an event for it."""

    def __init__(
        self,
        node: Node,
        replica: Replica,
        session: FetchSession,
        view: ClusterView,
        announce: bool = True,
        trace: FetchTrace | None = None,
    ) -> None:
        self.node, self.replica, self.session, self.view = node, replica, session, view
        self.announce = announce  # tell the swarm of each verified chunk (we serve it)
        self.trace = trace  # (TENSORHUB_TRACE: the fetch's timeline, else None)
        self._upstream: str | None = None  # (the relay upstream last traced)
        self.suspects: set[str] = set()  # sources gossip suspects now
        self.running: dict[asyncio.Task[None], Request] = {}
        self._tasks: dict[Request, asyncio.Task[None]] = {}
        self._calls: dict[Request, tuple[PeerHandler, int]] = {}
        self._scratch: dict[Request, list[memoryview]] = {}
        self._landing: set[PeerHandler] = set()  # abandoned since we last waited for them
        self.received: Counter[str] = Counter()  # verified bytes by source
        self.chunk_seconds = Histogram(CHUNK_BUCKETS)

    def perform(self, actions: Iterable[Action]) -> None:
        for a in actions:
            if isinstance(a, Send):
                self._start(a.request)
            elif isinstance(a, Abandon):
                self._abandon(a.request)
            elif isinstance(a, Behind):
                self._tell_behind(a.source)
            else:
                self.replica.incoming.pop(a.chunk, None)
                if not a.held:
                    self.replica.settle(a.chunk)  # who waited for it hears it is not coming
        planner = self.session.planner
        if self.trace is not None and planner.relay_upstream != self._upstream:
            self._upstream = planner.relay_upstream
            held, passed, before = planner.held, planner.passed_over(), planner.links_before
            lost, inputs = planner.lost_sources(), planner.chain_inputs()
            self.trace.event(
                "upstream",
                to=self._upstream,
                held=held,
                passed=passed,
                before=before,
                lost=lost,
                **inputs,
            )
        if planner.lagging and not self.replica.lagging:
            refused = self._lag()
            held = planner.held
            if self.trace is not None:
                up = planner.relay_upstream
                self.trace.event("lagging", held=held, up=up, refused=refused, paced=planner.paced)
            name, version = display_name(self.replica.key), self.replica.version
            if held == 0:  # (a lag is judged only from lag_chunks in: ChunkPlanner._note_lag)
                # Not a fault: a fetch that began after the chain went past it (a late
                # joiner, a lone fetcher among full holders) belongs at the tail.
                log.info(
                    "%s v%d: the relay chain went on before this fetch began; it relays "
                    "from the chain's tail",
                    name,
                    version,
                )
            elif planner.remembered_lagging:
                log.warning(
                    "%s v%d: this node fell behind the link before it in the relay chain "
                    "again (a slow NIC or host?) with %d of %d chunks; it began at the "
                    "chain's tail, as its last fetch ended lagging, and stays there",
                    name,
                    version,
                    held,
                    planner.num_chunks,
                )
            else:
                log.warning(
                    "%s v%d: this node fell behind the link before it in the relay chain "
                    "(a slow NIC or host?) with %d of %d chunks; it relays from the chain's "
                    "tail now",
                    name,
                    version,
                    held,
                    planner.num_chunks,
                )

    def _tell_behind(self, source: str) -> None:
        """Our head check found ``source``, the chain's head, slow: tell it so."""
        key, version = self.replica.key, self.replica.version
        told = self.node.tell_behind(source, key, version)
        head = self.node.peer_name(source)
        if head:  # the origins send no one to it from now on (Behind.who)
            for addr, src in self.session.planner.sources.items():
                if src.origin:
                    self.node.tell_behind(addr, key, version, who=head)
        log.info(
            "%s v%d: the relay chain's head %s is slower than the origin could feed this "
            "node; %s, and this node relays from the origin",
            display_name(key),
            version,
            source,
            "told it to move to the chain's tail" if told else "not connected to tell it",
        )

    def told_behind(self, peer: str) -> None:
        """The link after us says we are a slow chain head (its Behind): we move to the
        chain's tail, if we relay from the origin (FetchSession.told_behind)."""
        if self.session.told_behind():
            log.warning(
                "%s v%d: %s found this node slower than the origin could feed it (a slow "
                "NIC or host?); it relays from the relay chain's tail now",
                display_name(self.replica.key),
                self.replica.version,
                peer,
            )
            refused = self._lag()
            if self.trace is not None:
                held = self.session.planner.held
                self.trace.event("lagging", held=held, up=peer, refused=refused, told=True)

    def _lag(self) -> int:
        """We relay from the chain's tail now: park no one (``Replica.lag``), and answer
        "busy" to what is queued for a link that does not lag (``Node.refuse_queued``).
        How many replies were refused."""
        self.replica.lag()
        return self.node.refuse_queued(self.replica)

    def _start(self, r: Request) -> None:
        if self.trace is not None:
            self.trace.event("ask", chunk=r.chunk, src=r.source, dup=r.duplicate)
        into = None
        if r.duplicate:  # an endgame copy: into scratch, copied over only if it wins
            n = self.replica.manifest.layout.chunk_len(r.chunk)
            into = self._scratch[r] = [memoryview(bytearray(n))]

        def issued(peer: PeerHandler, rid: int) -> None:
            self._calls[r] = (peer, rid)
            if self.replica.incoming.get(r.chunk) == "":  # (dialled for this request)
                self.replica.incoming[r.chunk] = peer.conn.peer or ""

        def arriving() -> None:
            self.session.receiving(r, time.monotonic())

        onward = self.session.planner.onward(r)
        task = asyncio.ensure_future(
            _get(self.node, self.replica, r, into, issued, arriving, onward)
        )
        self.running[task] = r
        self._tasks[r] = task
        # Peers asking for it meanwhile wait for it here, but the one we ask (Replica.incoming).
        self.replica.incoming[r.chunk] = self.node.peer_name(r.source) or ""

    def _forget(self, r: Request) -> None:
        self._tasks.pop(r, None)
        self._calls.pop(r, None)
        self._scratch.pop(r, None)

    def _abandon(self, r: Request) -> None:
        """Drop a request now: its bytes can no longer reach the destination (but for a UCX
        receive already posted: :meth:`settled` waits for those)."""
        call = self._calls.get(r)
        if call is not None:
            call[0].abandon(call[1])
            self._landing.add(call[0])
        task = self._tasks.get(r)
        if task is not None:
            self.running.pop(task, None)
            if task.done():
                _ = task.cancelled() or task.exception()  # retrieved: it lost the race
            else:
                task.cancel()
        self._forget(r)

    async def settled(self) -> None:
        """Wait until no abandoned receive can still write into the destination."""
        while self._landing:
            await self._landing.pop().conn.quiesce()

    async def completed(self, task: asyncio.Task[None]) -> int | None:
        """A request's task ended: tell the session; the chunk if it landed."""
        r = self.running.pop(task, None)
        if r is None:
            return None  # abandoned while it completed
        err = TransferError("request cancelled") if task.cancelled() else task.exception()
        if err is not None:
            self._forget(r)
            outcome, holders = self._outcome(err)
            if self.trace is not None:
                self.trace.event("failed", chunk=r.chunk, src=r.source, why=outcome.name)
            self.perform(self.session.failed(r, outcome, holders))
            return None
        self.received[r.source] += self.replica.manifest.layout.chunk_len(r.chunk)
        took = time.monotonic() - self.session.issued_at[r]
        self.chunk_seconds.observe(took)
        if self.trace is not None:
            self.trace.event("got", chunk=r.chunk, src=r.source, s=round(took, 6))
        actions = self.session.verified(r)
        self.perform(a for a in actions if isinstance(a, Abandon))
        if r.duplicate:  # the scratch copy won: the losers are diverted, now copy it over
            await self.settled()
            src, pos = self._scratch[r][0], 0
            for part in self.replica.data.write_parts(r.chunk):
                part[:] = src[pos : pos + len(part)]
                pos += len(part)
            self.replica.mark(r.chunk)
        self._forget(r)
        self.perform(a for a in actions if not isinstance(a, Abandon))
        return r.chunk

    def _outcome(self, err: BaseException) -> tuple[Outcome, list[tuple[str, int]]]:
        """What an exception from a chunk request means to the session."""
        if isinstance(err, ChecksumMismatch):
            return Outcome.CORRUPT, []
        if isinstance(err, Refused):
            found = [self.view.locate(n) for n in err.holders]
            return Outcome.REDIRECTED, [f for f in found if f is not None]
        if isinstance(err, RemoteError):
            if err.code == "unknown_version":
                return Outcome.WITHDRAWN, []  # let go of it, or not there yet
            return (Outcome.BUSY if err.code == "busy" else Outcome.NOT_YET), []
        if isinstance(err, TransferError | OSError):
            return Outcome.LOST, []
        if isinstance(err, TensorHubError):
            return Outcome.FAILED, []
        raise err


async def _get(
    node: Node,
    replica: Replica,
    r: Request,
    into: list[memoryview] | None,
    issued: Callable[[PeerHandler, int], None],
    arriving: Callable[[], None],
    onward: bool = True,
) -> None:
    peer = await node.peer(r.source)
    await peer.get_chunk(
        replica, r.chunk, into=into, issued=issued, arriving=arriving, onward=onward
    )

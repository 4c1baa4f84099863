"""The Hub: tensorhub embedded in a trainer or an inference engine.

A Hub is one node joining the three planes: the version registry (Raft; this node is a
voter or a client of the voters), gossip (membership and who holds what) and the data plane
(chunks over authenticated TCP). ``publish`` serves the weights from the caller's memory,
advertises them and commits their manifest root; ``fetch`` reads the committed root,
finds holders in the gossip view, nearest first, and swarms the chunks into the caller's
tensors — serving each one onward as soon as it is verified. Afterwards the fetcher holds
the version too.

Bootstrap, as with etcd: the voters start with ``voter=True`` and the same ``seeds`` — all
voters' listen addresses, their own included — and a ``data_dir``; every other node starts
with ``voter=False`` and ``seeds`` naming any reachable nodes, and finds the voters by gossip.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch

from . import deltas, reads
from .control.gossip_driver import GossipNode
from .control.raft_driver import RaftNode
from .control.registry_client import DEFAULT_DEADLINE, RegistryClient
from .core.buckets import DEFAULT_BUCKET_BYTES
from .core.delta import delta_model, same_layout
from .core.errors import (
    AuthenticationError,
    DeadlineExceeded,
    TensorHubError,
    TransferError,
    UnknownVersion,
)
from .core.gossip import Status
from .core.gossip.holders import SAME_RACK, tier
from .core.histogram import CHUNK_BUCKETS, Histogram
from .core.layout import DEFAULT_CHUNK_SIZE
from .core.manifest import Manifest
from .core.naming import ShardKey, display_name, shard_key, split_key
from .core.registry import PublishShard, Release, Retain
from .core.swarm.presets import NODE, DataPlaneConfig, preset
from .core.swarm.serve import NO_CONTEXT, SeedContext, seed_context
from .dataplane.fetch import FetchResult
from .dataplane.node import Node, prepare_serving
from .dataplane.store import Replica
from .dataplane.swarm import NoManifest, copy_held, fetch_manifest, swarm_fetch, swarm_fill
from .dataplane.view import NO_NEWS, Holder, SourceNews
from .io.device import current_streams, on_streams
from .io.raft_storage import RaftStorage
from .io.shaping import Link, WanShaper
from .io.tensors import TensorBytes, empty_like_manifest
from .transforms import Transform
from .transforms import apply as apply_transforms

T = TypeVar("T")
log = logging.getLogger(__name__)
ROLE_KEY = "role"
UCX_KEY = "ucx"
"""Gossiped: where a node takes UCX connections (absent: TCP only)."""
SECRET_PROBE_TIMEOUT = 1.5
"""How long :meth:`Hub.start` waits for seeds to answer the secret probe: a seed that is
down or slow is skipped (the cluster may be starting), so this bounds start's delay."""

MOVED_ON_PATIENCE = 10.0
"""Seconds (at most half a fetch's timeout) a fetch or manifest read waits for a holder
of a version a newer one has superseded (none by then: every holder moved on, it fails
with NoHolder), and a fetch with a base here for its delta (none by then: whole chunks
instead). A version or delta whose every holder moved on must not cost the fetch its
whole deadline: a launch's rollout a version behind waited 240 s for a v2 that every
holder had overwritten, and one that read v1 as the latest a moment before v2 committed
waited its 300 s for v1's manifest (CI, tests/test_cluster_page.py). The latest version
is waited for to the deadline: its publisher is still to advertise it, or keeps a copy."""
DELTAS_KEPT = 2
"""Delta objects of a model each node goes on serving (the newest ones): a rollout one
version behind still finds the delta it needs; an older one fetches whole chunks."""

SUPER_SEED_AFTER = NODE.reserve_after
"""Seconds a published chunk's requests are refused (redirected) before it is sent again
(ten times that while gossip lists a node it went to as alive; at once if all died)."""


class PublishRejected(TensorHubError):
    """The registry refused a publish (a conflicting root, or a version not newer)."""


class NoHolder(TransferError):
    """No live node holds the version (yet)."""


@dataclass(frozen=True)
class Published:
    manifest: Manifest
    committed: bool  # this shard completed the version


def _dc(locality: str) -> str:
    return locality.split("/", 1)[0]


class Hub:
    def __init__(
        self, node: Node, gossip: GossipNode, raft: RaftNode | None, seeds: Sequence[str]
    ) -> None:
        self.node = node
        self.gossip = gossip
        self.raft = raft
        self._seeds = list(seeds)
        self.registry = RegistryClient(node, self._voters)
        self._kept: set[tuple[str, int, int]] = set()  # CPU copies kept by unpublish
        self.fetches: deque[FetchResult] = deque(maxlen=64)  # recent, for status pages
        self.fetch_seconds: dict[str, Histogram] = defaultdict(Histogram)
        """Per model: how long successful fetches took, start to verified (for /metrics)."""
        self.chunk_seconds: dict[str, Histogram] = defaultdict(lambda: Histogram(CHUNK_BUCKETS))
        """Per model: chunk requests, issued to verified, over all fetches."""
        self.manifest_seconds: dict[str, Histogram] = defaultdict(Histogram)
        """Per model: how long fetches waited for the manifest (the first holder's answer)."""
        self.replicate_seconds: dict[str, Histogram] = defaultdict(Histogram)
        """Per model: how long :meth:`wait_replicated` blocked the publisher (its stall)."""
        self.committed: dict[str, int] = {}
        """Per model: the newest version this node knows to be committed (published here,
        fetched here, or read with :meth:`latest`)."""
        self.fetch_totals: Counter[str] = Counter()  # fetches, bytes, failed requests
        self._name_at: dict[str, str] = {}  # address -> member name, for routing
        self._source_watch: dict[tuple[str, int], list[Callable[[SourceNews], None]]] = {}
        self._change_watch: dict[tuple[str, int], list[Callable[[], None]]] = {}
        gossip.on_changes.append(self._on_gossip_changes)
        self.ucx_across_dcs = False
        """Use UCX to peers in other datacenters too (off: WANs are TCP's, see the docs)."""
        self.super_seed_after: float | None = node.dataplane.reserve_after
        """Publish as a super-seeding origin (None: serve every request, as a plain holder)."""
        self.seed_spare = node.dataplane.seed_spare
        """A super-seeding origin with idle upload slots also sends repeat copies (False: its
        NIC carries training traffic, so it sends each chunk once)."""

    @classmethod
    async def start(
        cls,
        name: str,
        *,
        locality: str = "dc0/rack0/host0",
        listen: str = "127.0.0.1:0",
        seeds: Sequence[str] = (),
        voter: bool = False,
        data_dir: str | Path | None = None,
        secret: bytes | str | None = None,
        transport: str | None = None,
        dataplane: DataPlaneConfig | str = NODE,
    ) -> Hub:
        """``transport``: "auto" (default; or ``TENSORHUB_TRANSPORT``), "tcp" or "ucx" —
        see :func:`~tensorhub.dataplane.node.want_ucx`. With UCX, connections to peers of our own
        datacenter that have it too go over UCX; everything else, across datacenters
        included, over TCP (set :attr:`ucx_across_dcs` to change that). ``dataplane``: the
        data plane's settings, or a preset's name (``core/swarm/presets.py``)."""
        dp_cfg = preset(dataplane) if isinstance(dataplane, str) else dataplane
        view = _GossipView()
        node = await Node.start(
            name, listen=listen, secret=secret, transport=transport, view=view, dataplane=dp_cfg
        )
        try:
            gossip = GossipNode(
                node, locality, seeds, data_dir=Path(data_dir) / "gossip" if data_dir else None
            )
            raft = None
            if voter:
                if node.address not in seeds:
                    raise ValueError(f"voter {node.address} must be in seeds (the voter set)")
                if data_dir is None:
                    raise ValueError("a voter needs a data_dir for its Raft log")
                raft = RaftNode(node, list(seeds), RaftStorage.open(Path(data_dir) / "raft"))
                gossip.core.set_local(ROLE_KEY, b"voter")
            hub = cls(node, gossip, raft, seeds)
            view.hub = hub
            if node.ucx_address is not None:
                gossip.core.set_local(UCX_KEY, node.ucx_address.encode())
            await _check_secret(node, seeds)
            await gossip.start()
            if raft is not None:
                await raft.start()
        except BaseException:
            await node.close()
            raise
        return hub

    @property
    def address(self) -> str:
        return self.node.address

    @property
    def locality(self) -> str:
        return self.gossip.core.me.locality

    def emulate_wan(self, links: Mapping[str, Link]) -> None:
        """Shape this node's traffic to other datacenters (remote DC → :class:`Link`): for
        running a multi-datacenter cluster on one machine. Off unless called."""
        core = self.gossip.core

        def dc_of(name: str) -> str | None:
            loc = core.locality_of(name)
            return None if loc is None else _dc(loc)

        self.node.shaper = WanShaper(_dc(self.locality), links, dc_of) if links else None

    def _ucx_route(self, addr: str) -> str | None:
        """The UCX address to dial for the peer at TCP ``addr``: when it gossips one and is
        in our datacenter (or :attr:`ucx_across_dcs`); else None, and TCP is used."""
        core = self.gossip.core
        n = self._name_at.get(addr)
        if n is None or core.addr_of(n) != addr:  # asked per chunk request: scan rarely
            self._name_at = {a: m for m in core.alive() if (a := core.addr_of(m)) is not None}
            n = self._name_at.get(addr)
        if n is None or n == core.name or core.status(n) is Status.DEAD:
            return None
        where = core.locality_of(n)
        theirs = core.state.get(n, UCX_KEY)
        if theirs is None or where is None:
            return None
        if not self.ucx_across_dcs and _dc(where) != _dc(self.locality):
            return None
        return theirs.decode()

    def _voters(self) -> list[str]:
        if self.raft is not None:
            return list(self.raft.voters)
        core = self.gossip.core
        found = [
            a
            for n in core.alive()
            if core.state.get(n, ROLE_KEY) == b"voter" and (a := core.addr_of(n)) is not None
        ]
        return found or [s for s in self._seeds if s != self.address]

    # -- publishing ----------------------------------------------------------------------------

    async def publish(
        self,
        model: str,
        version: int,
        tensors: Mapping[str, torch.Tensor],
        *,
        shard: int = 0,
        num_shards: int = 1,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        transforms: Sequence[Transform] = (),
        delta_from: int | None = None,
    ) -> Published:
        """Serve ``tensors`` and commit them as shard ``shard`` of (model, version).

        CPU tensors are served in place (no copy: they must not change until
        :meth:`unpublish` returns); CUDA tensors are copied to pinned host memory here,
        so training may write them again as soon as this returns. ``transforms``
        (:mod:`tensorhub.transforms`: renames, casts, fp8, fusing, rank-major layouts) run
        here, once, and the manifest records them; a tensor a transform made is a copy.

        ``delta_from=u``: also publish the delta that rebuilds this version from version
        ``u``, which this node must still hold whole (:mod:`tensorhub.core.delta`); it is
        committed before the version, so a fetcher that sees the version committed finds
        its delta. Fetchers holding ``u`` then move the delta instead of the model."""
        dp = shard_key(model, shard)
        base = self._delta_base(dp, delta_from) if delta_from is not None else None
        streams = current_streams(tensors.values())

        def prepare() -> tuple[TensorBytes, Manifest]:
            with on_streams(streams):  # (device copies ordered after the caller's writes)
                published, applied = apply_transforms(tensors, transforms)
                return prepare_serving(published, chunk_size, transforms=applied)

        # Transforms, the copy off a device and hashing every byte run in a thread: on the
        # event loop they silenced this node's gossip for as long (seconds, for a large
        # model), and peers could take the publisher for dead while it published.
        data, manifest = await asyncio.to_thread(prepare)
        self.node.serve_prepared(
            dp,
            version,
            data,
            manifest,
            super_seed=self.super_seed_after,
            seed_spare=self.seed_spare,
        )
        if transforms and data.borrowed:  # only what is still the caller's memory is
            data.borrowed = data.shares_memory(tensors.values())
        borrowed = data.borrowed
        self.gossip.advertise(
            dp, version, b"\1" * manifest.num_chunks, origin=True, borrowed=borrowed
        )
        if base is not None:
            await self._publish_delta(model, version, shard, num_shards, base, manifest)
        cmd = PublishShard(
            model, version, shard, num_shards, manifest.root, self.node.name, manifest.total_bytes
        )
        try:
            res = await self.registry.propose(cmd)
        except BaseException:
            await self._withdraw(dp, version)
            raise
        if not res.ok:
            await self._withdraw(dp, version)
            raise PublishRejected(f"{model} v{version} shard {shard}: {res.code}: {res.message}")
        if res.committed:
            self._saw_committed(model, version)
        if res.committed and self._kept:
            await self._drop_kept(model)
        return Published(manifest, res.committed)

    def _delta_base(self, dp: str, base: int) -> Replica:
        try:
            replica = self.node.store.get(dp, base)
        except UnknownVersion:
            raise UnknownVersion(
                f"a delta from {display_name(dp)} v{base} needs that version held here "
                "(publish the next version before unpublishing this one)"
            ) from None
        if not replica.complete:
            raise UnknownVersion(f"{display_name(dp)} v{base} is not held here whole")
        return replica

    async def _publish_delta(
        self, model: str, version: int, shard: int, num_shards: int, base: Replica, m: Manifest
    ) -> None:
        """Encode, serve and commit the delta rebuilding ``version`` from ``base``. The
        version does not depend on it: a delta that cannot be made or committed is logged,
        and fetchers take whole chunks."""
        dp = shard_key(model, shard)
        if not same_layout(base.manifest, m):
            log.warning(
                "%s v%d: no delta from v%d (the tensors or chunking changed)",
                display_name(dp),
                version,
                base.version,
            )
            return
        new = self.node.store.get(dp, version).data
        tensors = await asyncio.to_thread(deltas.encode, base.data, new, m, base.version)
        dmodel = delta_model(model)
        dkey = shard_key(dmodel, shard)
        dm = self.node.serve(dkey, version, tensors, chunk_size=m.layout.chunk_size)
        self.gossip.advertise(dkey, version, b"\1" * dm.num_chunks, borrowed=False)
        cmd = PublishShard(
            dmodel, version, shard, num_shards, dm.root, self.node.name, dm.total_bytes
        )
        try:
            res = await self.registry.propose(cmd)
        except TensorHubError as e:
            log.warning("%s v%d: delta not committed: %s", display_name(dp), version, e)
            await self._withdraw(dkey, version)
            return
        if not res.ok:
            log.warning(
                "%s v%d: delta not committed: %s: %s",
                display_name(dp),
                version,
                res.code,
                res.message,
            )
            await self._withdraw(dkey, version)
            return
        await self._drop_old_deltas(dkey, version)

    async def _drop_old_deltas(self, dkey: str, newest: int) -> None:
        """Serve only the :data:`DELTAS_KEPT` newest delta objects of a shard."""
        held = sorted({r.version for r in self.node.store if r.key == dkey}, reverse=True)
        for v in held:
            if v < newest and held.index(v) >= DELTAS_KEPT:
                await self._withdraw(dkey, v)

    async def wait_replicated(
        self,
        model: str,
        version: int,
        *,
        copies: int = 1,
        shard: int = 0,
        timeout: float = 60.0,
    ) -> None:
        """Return once ``copies`` complete copies of the shard exist on other nodes (as
        gossip reports them): then the publisher may unpublish and reuse its memory."""
        dp = shard_key(model, shard)
        core = self.gossip.core
        loop = asyncio.get_running_loop()
        start = loop.time()
        changed = asyncio.Event()
        unwatch = self._watch_changes(dp, version, changed.set)
        try:
            while (
                sum(
                    h.complete
                    for n, h in core.holders.holders(dp, version).items()
                    if n != core.name and core.locality_of(n) is not None
                )
                < copies
            ):
                changed.clear()
                try:
                    await asyncio.wait_for(changed.wait(), max(0.0, start + timeout - loop.time()))
                except asyncio.TimeoutError:
                    raise NoHolder(
                        f"fewer than {copies} copies of {model} v{version} after {timeout}s"
                    ) from None
        finally:
            unwatch()
        self.replicate_seconds[model].observe(asyncio.get_running_loop().time() - start)

    async def unpublish(
        self, model: str, version: int, *, shard: int = 0, keep_copy: bool = True
    ) -> bool:
        """Stop serving the caller's buffers; returns once no upload reads them any more
        (they may change then).

        If this node is the last complete holder of the latest or a retained version, the
        version must stay readable: with ``keep_copy`` this node goes on serving it from a
        CPU copy (returns True); without, it withdraws and the version is unavailable until
        it is published again — fetches fail with :class:`NoHolder`, never a wrong byte."""
        dp = shard_key(model, shard)
        if keep_copy and await self._must_keep(model, version, dp):
            await self._keep_copy(model, version, shard)
            return True
        await self._withdraw(dp, version)
        return False

    async def _drop_kept(self, model: str) -> None:
        """Let go of CPU copies of ``model`` no longer needed (superseded, not retained)."""
        kept = sorted(k for k in self._kept if k[0] == model)
        if not kept:
            return
        with contextlib.suppress(TensorHubError):
            latest = await self.registry.latest(model)
            for m, v, shard in kept:
                if v < latest and not await self.registry.retained(model, v):
                    self._kept.discard((m, v, shard))
                    await self._withdraw(shard_key(m, shard), v)

    async def _keep_copy(self, model: str, version: int, shard: int) -> None:
        """Go on serving a shard from a CPU copy of our own, and say it lasts. If its bytes
        changed under us (the contract broken), withdraw it: serve nothing wrong."""
        dp = shard_key(model, shard)
        try:
            if self.node.store.get(dp, version).data.borrowed:  # else the copy is ours already
                await self.node.keep_copy(dp, version)
        except BaseException:
            await self._withdraw(dp, version)
            raise
        self._kept.add((model, version, shard))
        replica = self.node.store.get(dp, version)
        self.gossip.advertise(
            dp,
            version,
            replica.have,
            origin=replica.seeder is not None and replica.seeder.origin,
            borrowed=False,
        )

    async def _must_keep(self, model: str, version: int, dp: str) -> bool:
        """Are we about to drop the last lasting copy of the latest or a retained version?

        Only copies that will stay count: a holder that fetched into its engine's own
        weights (``borrowed``) overwrites them with the next version, so sixteen of those
        are no better than none (issue #15, break 6)."""
        core = self.gossip.core
        others = any(
            h.complete and not h.borrowed and n != core.name and core.locality_of(n) is not None
            for n, h in core.holders.holders(dp, version).items()
        )
        if others:
            return False
        try:
            return await self.registry.latest(model) == version or await self.registry.retained(
                model, version
            )
        except TensorHubError:
            return True  # cannot tell (no quorum): err on the side of keeping it readable

    async def _withdraw(self, dp: str, version: int) -> None:
        self.gossip.withdraw(dp, version)
        await self.node.withdraw(dp, version)

    # -- reading -------------------------------------------------------------------------------

    async def latest(self, model: str, *, timeout: float = DEFAULT_DEADLINE) -> int:
        """The newest committed version (linearizable; 0 if none); :class:`NoQuorum` if the
        registry cannot answer within ``timeout`` seconds."""
        v = await self.registry.latest(model, timeout)
        self._saw_committed(model, v)
        return v

    def _saw_committed(self, model: str, version: int) -> None:
        if version > self.committed.get(model, 0):
            self.committed[model] = version

    async def watch(self, model: str, poll: float = 0.2) -> AsyncGenerator[int, None]:
        """Committed versions of ``model`` as they appear (each newer than the last)."""
        last = 0
        while True:
            v = await self.registry.latest(model)
            if v > last:
                last = v
                yield v
            await asyncio.sleep(poll)

    def _sources(
        self,
        dp: str,
        version: int,
        names: Iterable[str] | None = None,
        health: Mapping[str, Status] | None = None,
        changed: Iterable[str] = (),
    ) -> SourceNews:
        """Source news for a fetch of (dp, version): the holders among ``names`` (None:
        all) as hints, nearest first; our datacenter's fetchers of the version and its
        other live members; ``health`` (what gossip says of each member), if given; and
        as ``gone``, the live nodes among ``changed`` (their advertisement of the version
        changed) that advertise it no more: they unpublished it, or a fetch failed there.
        Not a node declared dead (gossip drops its advertisements with the verdict): that
        is ``health``'s, whose ``source_dead`` abandons what is in flight to it; listed as
        gone too, it left the fetch's sources first, the verdict found it no more, and
        its requests to a hung holder waited out their 10 s timeout
        (tests/test_hung_holder.py)."""
        core = self.gossip.core
        me = core.me.locality
        my_dc = _dc(me)
        out, fetchers = [], [self.address]
        members = [
            a
            for n in core.alive()
            if (loc := core.locality_of(n)) is not None
            and _dc(loc) == my_dc
            and (a := core.addr_of(n)) is not None
        ]
        held = core.holders.holders(dp, version)
        for name, h in held.items():
            addr, loc = core.addr_of(name), core.locality_of(name)
            if addr is None or loc is None or addr == self.address:
                continue
            if _dc(loc) == my_dc and not h.complete:
                fetchers.append(addr)
            if names is not None and name not in names:
                continue
            chunks = None if h.complete else h.chunks()  # None: all (O(1) for the planner)
            out.append(Holder(addr, tier(me, loc), chunks, h.origin, h.lagging))
        out.sort(key=lambda h: h.tier)
        gone = [
            a
            for n in sorted(changed)
            if n not in held
            and core.status(n) in (Status.ALIVE, Status.SUSPECT)
            and (a := core.addr_of(n)) is not None
            and a != self.address
        ]
        return SourceNews(out, fetchers, members, health, gone)

    def _watch_sources(
        self, dp: str, version: int, tell: Callable[[SourceNews], None]
    ) -> Callable[[], None]:
        """Call ``tell`` with news of (dp, version)'s sources as gossip learns it."""
        return _register(self._source_watch, (dp, version), tell)

    def _watch_changes(self, dp: str, version: int, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` whenever gossip learns something of (dp, version)'s holders, with
        no news built (a waiter that rereads the holder view itself)."""
        return _register(self._change_watch, (dp, version), wake)

    def _on_gossip_changes(
        self, holders: dict[tuple[str, int], set[str]], members: set[str]
    ) -> None:
        """Gossip changed holder advertisements or member statuses: tell the fetches (and
        waiters) watching the versions concerned, with only what changed."""
        for key, wakes in list(self._change_watch.items()):
            if members or key in holders:
                for wake in list(wakes):
                    wake()
        health = self._health() if members and self._source_watch else None
        for key, tells in list(self._source_watch.items()):
            names = holders.get(key, set())
            if not names and not members:
                continue
            # A member whose status changed is listed anew if it holds the version: one
            # back from suspicion or a false death was dropped as a source meanwhile, and a
            # complete holder advertises nothing new that would bring it back.
            news = self._sources(*key, names | members, health, changed=names)
            for tell in list(tells):
                tell(news)

    def _locate(self, name: str) -> tuple[str, int] | None:
        """A node's address and locality tier from us, from gossip (for redirects)."""
        core = self.gossip.core
        addr, loc = core.addr_of(name), core.locality_of(name)
        return None if addr is None or loc is None else (addr, tier(core.me.locality, loc))

    def _seed_context(self, peer: str) -> SeedContext:
        """For super-seeding: where ``peer`` is, from gossip (the rule is the serve core's).

        Members, not known fetchers, count as carrying the version across the WAN:
        fetchers that start together are learnt of by gossip too late. If our members do
        not fetch, remote requests wait ``super_seed_after`` once per chunk, then are
        served."""
        core = self.gossip.core
        loc = core.locality_of(peer)

        def dc_of(name: str) -> str | None:
            where = core.locality_of(name)
            return None if where is None else _dc(where)

        my_dc = _dc(core.me.locality)

        def others_here() -> bool:
            return any(n != core.name and dc_of(n) == my_dc for n in core.alive())

        return seed_context(
            my_dc, None if loc is None else _dc(loc), others_here, dc_of, self._alive
        )

    def _lagged_before(self, key: ShardKey) -> frozenset[str]:
        """The addresses of the nodes whose lag memory of ``key`` gossip holds."""
        core = self.gossip.core
        return frozenset(a for n in core.holders.lagged(key) if (a := core.addr_of(n)) is not None)

    def _lagging(self, key: ShardKey, version: int, name: str) -> bool:
        """Does ``name`` advertise (key, version) as a relay link that fell behind?"""
        held = self.gossip.core.holders.holding(key, version, name)
        return held is not None and held.lagging

    def _near(self, name: str) -> bool:
        """Is ``name`` in our rack (or on our host)? Its requests may queue longer here."""
        core = self.gossip.core
        loc = core.locality_of(name)
        return loc is not None and tier(core.me.locality, loc) <= SAME_RACK

    def _alive(self, name: str) -> bool:
        return self.gossip.core.status(name) is Status.ALIVE

    def _health(self) -> dict[str, Status]:
        """What gossip says of each member with news (suspect, dead, refuted), by address:
        the swarm drops sources declared dead and asks suspects for nothing new."""
        return {m.addr: m.status for m in self.gossip.core.members.records() if m.addr}

    async def _committed_root(self, model: str, version: int, shard: int) -> bytes:
        roots = await self.registry.version(model, version)
        if roots is None:
            raise UnknownVersion(f"{model} v{version} is not committed")
        if not 0 <= shard < len(roots):
            raise UnknownVersion(f"{model} v{version} has {len(roots)} shard(s), not {shard}")
        return roots[shard]

    async def _from_holders(
        self,
        dp: str,
        version: int,
        timeout: float,
        attempt: Callable[[list[Holder], float], Awaitable[T]],
    ) -> T:
        """Run ``attempt(holders, seconds_left)`` on the holders gossip knows, again with
        fresher gossip whenever every hint was stale, until ``timeout``; or, for a version
        a newer one superseded, until ``MOVED_ON_PATIENCE`` without a holder."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + timeout
        patience = min(timeout / 2, MOVED_ON_PATIENCE)
        hinted = False
        asked = start  # when the registry was last asked whether a newer version exists
        while True:
            holders = self._sources(dp, version).holders
            if not holders and not hinted:
                hinted = True
                holders = await self._publisher_hint(dp, version)
            if holders:
                try:
                    return await attempt(holders, max(deadline - loop.time(), 0.1))
                except NoManifest:
                    pass  # every hint was stale: wait for gossip to tell us more
            now = loop.time()
            if now > deadline:
                raise NoHolder(f"no live node holds {display_name(dp)} v{version}")
            if now - start >= patience and now - asked >= 1.0:
                asked = now
                newer = await self._superseded_by(dp, version, min(1.0, deadline - now))
                if newer is not None:
                    raise NoHolder(
                        f"no live node holds {display_name(dp)} v{version}: its holders "
                        f"moved on (v{newer} is committed), none held it for {now - start:.0f}s"
                    )
            await asyncio.sleep(0.05)

    def _moved_on(self, dp: str, version: int) -> bool:
        """Whether a newer version of ``dp``'s model is known committed, without asking
        the registry (a stalled fetch asks every tick): seen committed here, or held whole
        by a node that fetched it (gossip)."""
        model = split_key(dp)[0]
        if self.committed.get(model, 0) > version:
            return True
        return self.gossip.core.holders.newer_fetched(dp, version) is not None

    async def _superseded_by(self, dp: str, version: int, timeout: float) -> int | None:
        """The latest committed version of ``dp``'s model if newer than ``version`` (None
        if not, or if the registry cannot say within ``timeout``: then the fetch waits
        on). A newer one this node already saw committed answers without asking."""
        model = split_key(dp)[0]
        if (seen := self.committed.get(model, 0)) > version:
            return seen
        try:
            latest = await self.latest(model, timeout=max(timeout, 0.05))
        except TensorHubError:
            return None
        return latest if latest > version else None

    async def _publisher_hint(self, dp: str, version: int) -> list[Holder]:
        """The shard's publisher, as the registry recorded it, when gossip has not yet told
        us of any holder: a version committed a moment ago is otherwise found a gossip
        round or two later (measured by bench/small_versions.py: 266 ms of a 531 ms fetch
        of a 4 MiB version). A hint like any other: if it no longer holds the version,
        the attempt fails over to what gossip learns."""
        model, shard = split_key(dp)
        with contextlib.suppress(TensorHubError):
            names = await self.registry.publishers(model, version)
            core = self.gossip.core
            if shard < len(names) and self._alive(name := names[shard]):
                addr, loc = core.addr_of(name), core.locality_of(name)
                if addr is not None and loc is not None and addr != self.address:
                    return [Holder(addr, tier(core.me.locality, loc), None, origin=True)]
        return []

    async def latest_held(
        self, model: str, at_least: int, *, shard: int = 0, timeout: float = DEFAULT_DEADLINE
    ) -> int:
        """The newest committed version >= ``at_least`` that a live node holds whole, at
        the nearest locality tier that holds any: a staleness-bounded read's choice.

        Asynchronous RL accepts a policy a few versions old ("any version >= latest - k");
        a rollout across a WAN should start at once on a v-1 its own datacenter holds
        rather than wait for v to cross. Nearness wins over newness (that is the point),
        and among versions held equally near the newest wins. One registry round trip
        (``latest``), plus one when the choice is not the latest (is it committed?).
        :class:`UnknownVersion` if ``at_least`` is past the latest; :class:`NoHolder` if
        gossip shows no live node holding a version in range whole within ``timeout``."""
        latest = await self.latest(model, timeout=timeout)
        if at_least > latest:
            raise UnknownVersion(f"{model}: v{at_least} is not committed (latest v{latest})")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for version in self._held_near(shard_key(model, shard), at_least, latest):
                if version == latest or await self.registry.version(model, version) is not None:
                    return version
            if loop.time() > deadline:
                raise NoHolder(f"no live node holds {model} v{at_least}..v{latest} whole")
            await asyncio.sleep(0.05)  # gossip has not told us of a holder yet

    def _held_near(self, dp: str, low: int, high: int) -> list[int]:
        """Versions in [low, high] some live node holds whole: nearest tier first, then
        newest first (from gossip's holder view; this node's own copies are tier 0)."""
        core = self.gossip.core
        me = core.me.locality
        nearest: dict[int, int] = {}  # version -> nearest tier holding it whole
        for key, version in core.holders.versions():
            if key != dp or not low <= version <= high:
                continue
            for name, held in core.holders.holders(dp, version).items():
                loc = core.locality_of(name)
                if not held.complete or loc is None:
                    continue
                if name != core.me.name and not self._alive(name):
                    continue
                t = tier(me, loc)
                nearest[version] = min(t, nearest.get(version, t))
        return sorted(nearest, key=lambda v: (nearest[v], -v))

    async def fetch(
        self,
        model: str,
        version: int | None,
        into: Mapping[str, torch.Tensor],
        *,
        at_least: int | None = None,
        shard: int = 0,
        timeout: float = 60.0,
    ) -> FetchResult:
        """Fetch a committed version into ``into`` (same names, dtypes and shapes), every
        byte verified; then this node holds it and serves it. With ``version=None`` and
        ``at_least``, the version is :meth:`latest_held`'s choice; the result's
        ``version`` says which was fetched."""
        if (version is None) == (at_least is None):
            raise TypeError("fetch wants a version, or None and at_least=")
        if version is None:
            assert at_least is not None
            version = await self.latest_held(model, at_least, shard=shard)
        root = await self._committed_root(model, version, shard)
        loop = asyncio.get_running_loop()
        start = loop.time()
        res = await self._fetch_delta(model, version, into, shard, root, timeout)
        if res is None:
            left = max(timeout - (loop.time() - start), 0.1)
            res = await self._fetch_whole(model, version, into, shard, root, left)
        self._fetched(model, version, res)
        if self._kept:  # copies kept for versions this fetch may have superseded
            await self._drop_kept(model)
        return res

    async def _fetch_whole(
        self,
        model: str,
        version: int,
        into: Mapping[str, torch.Tensor],
        shard: int,
        root: bytes,
        timeout: float,
        replica: Replica | None = None,
    ) -> FetchResult:
        """Swarm the version's chunks into ``into`` (those ``replica`` lacks, where it is
        given: a delta rebuilt the rest)."""
        dp = shard_key(model, shard)
        if replica is None:
            await self._free(into, dp, version)

        lagging = [False]  # as last advertised

        def progress(filling: Replica, chunk: int) -> None:
            # Advertise the replica at once, then about 64 times per fetch, then when whole
            # (each advertisement is a gossip write of the full bitmap), and at once when
            # its relay fell behind (another that does relays from it: Holding.lagging).
            n = len(filling.have)
            step = max(1, n // 64)
            held = filling.held
            if chunk < 0 or held % step == 0 or held == n or filling.lagging != lagging[0]:
                lagging[0] = filling.lagging
                self.gossip.advertise(
                    dp, version, filling.have, borrowed=True, lagging=filling.lagging
                )
            if held == n and chunk >= 0:  # (whole: our next fetch of dp begins with it)
                self.gossip.remember_lag(dp, version, filling.lagging)

        if replica is not None and replica.complete:  # a delta rebuilt every chunk
            return await swarm_fill(self.node, replica, [], on_chunk=progress)

        superseded = partial(self._moved_on, dp, version)

        async def attempt(holders: list[Holder], left: float) -> FetchResult:
            run: Awaitable[FetchResult] = (
                swarm_fill(
                    self.node,
                    replica,
                    holders,
                    on_chunk=progress,
                    timeout=left,
                    superseded=superseded,
                )
                if replica is not None
                else swarm_fetch(
                    self.node,
                    dp,
                    version,
                    into,
                    holders,
                    expected_root=root,
                    on_chunk=progress,
                    timeout=left,
                    superseded=superseded,
                )
            )
            try:
                # A backstop: the swarm reports its own deadline, with causes.
                return await asyncio.wait_for(run, left + 5.0)
            except asyncio.TimeoutError:
                raise TransferError(
                    f"fetch of {model} v{version} did not finish within {timeout}s "
                    "(the manifest never arrived)"
                ) from None

        if replica is None and self._held_complete(dp, version, root) is not None:
            # Held here, whole (a publisher reading its own version into other tensors):
            # a checked local copy. Gossip lists only other holders, so a sole holder
            # found none and failed with NoHolder after the timeout.
            return await attempt([], timeout)
        try:
            return await self._from_holders(dp, version, timeout, attempt)
        except BaseException:
            self.gossip.withdraw(dp, version)
            self.fetch_totals["failed"] += 1
            raise

    def _fetched(self, model: str, version: int, res: FetchResult) -> None:
        self.fetches.append(res)
        self.fetch_seconds[model].observe(res.seconds)
        self.manifest_seconds[model].observe(res.manifest_seconds)
        self.chunk_seconds[model].merge(res.chunk_seconds)
        self._saw_committed(model, version)
        self.fetch_totals["fetches"] += 1
        self.fetch_totals["bytes"] += res.bytes
        self.fetch_totals["failed_requests"] += sum(res.failures.values())

    async def _fetch_delta(
        self,
        model: str,
        version: int,
        into: Mapping[str, torch.Tensor],
        shard: int,
        root: bytes,
        timeout: float,
    ) -> FetchResult | None:
        """Reach ``version`` from an older version held here whole, through the delta
        committed for it (:mod:`tensorhub.core.delta`): fetch the delta object from the
        swarm (this node then serves it onward), rebuild each chunk it encodes, keep
        those that match the manifest's digests, and swarm the rest whole. None where
        there is no base here, no delta, or a delta from another base: fetch whole.

        Into the base's own memory (a rollout's weights), this is also an unpublish of the
        base: it stops being served from there, drained, before any byte changes."""
        dp = shard_key(model, shard)
        bases = {
            r.version: r
            for r in self.node.store
            if r.key == dp and r.complete and r.version < version and not r.withdrawn
        }
        if not bases:
            return None
        dmodel = delta_model(model)
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + timeout
        patience = min(timeout / 2, MOVED_ON_PATIENCE)
        try:
            droots = await self.registry.version(dmodel, version)
            if droots is None or shard >= len(droots):
                return None
        except TensorHubError:
            return None
        # The version's own manifest first: if nobody holds the version any more (every
        # holder moved on to a newer one), that is the fetch's answer, within patience.
        try:
            manifest = await self.manifest(model, version, shard=shard, timeout=patience)
        except TensorHubError:
            self.fetch_totals["failed"] += 1
            raise
        try:
            dman = await self.manifest(dmodel, version, shard=shard, timeout=patience)
            delta = empty_like_manifest(dman)
            left = max(started + patience - loop.time(), 0.1)
            dres = await self._fetch_whole(dmodel, version, delta, shard, droots[shard], left)
            index = deltas.index_of(delta, manifest.num_chunks)
        except TensorHubError as e:  # (DeltaError, NoHolder, TransferError, no quorum...)
            log.warning("%s v%d: fetching whole, the delta failed: %s", model, version, e)
            return None
        await self._drop_old_deltas(shard_key(dmodel, shard), version)
        base = bases.get(index.base)
        if base is None or not same_layout(base.manifest, manifest):
            return None  # a delta from a version we do not hold (we fell behind)
        await self._free(into, dp, version)  # the base may live in `into`: drained first
        dest = TensorBytes.for_destination(manifest, into)
        rebuilt, refused = await asyncio.to_thread(
            deltas.rebuild, base.data, dest, manifest, index, delta[deltas.BLOB]
        )
        if refused:
            log.warning(
                "%s v%d: %d chunk(s) rebuilt from v%d did not match their digests (a stale "
                "or corrupt base): fetching them whole",
                model,
                version,
                len(refused),
                index.base,
            )
        replica = Replica(dp, version, manifest, dest)
        for c in rebuilt:
            replica.mark(c)
        left = max(deadline - loop.time(), 0.1)
        res = await self._fetch_whole(model, version, into, shard, root, left, replica)
        return replace(
            res,
            seconds=time.perf_counter() - t0,
            sources=dict(Counter(res.sources) + Counter(dres.sources)),
            delta_base=index.base,
            delta_bytes=dres.bytes,
            delta_chunks=len(rebuilt),
            delta_refused=len(refused),
        )

    def stream(
        self,
        model: str,
        version: int,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        shard: int = 0,
        timeout: float = 60.0,
    ) -> AsyncGenerator[list[tuple[str, torch.Tensor]], None]:
        """The version bucket by bucket, as lists of ``(name, tensor)`` viewing one reused
        buffer of about ``bucket_bytes``: for engines that load through
        ``load_weights(iterable)``, without a second copy of the model
        (:func:`tensorhub.reads.stream`)."""
        return reads.stream(
            self, model, version, bucket_bytes=bucket_bytes, shard=shard, timeout=timeout
        )

    async def fetch_slices(
        self,
        model: str,
        version: int,
        into: Mapping[str, torch.Tensor],
        slices: Mapping[str, reads.TensorSlice],
        *,
        shard: int = 0,
        timeout: float = 60.0,
    ) -> FetchResult:
        """Fetch part of a version: ``slices[name]`` of the sliced tensors (e.g. a
        tensor-parallel rank's, from :func:`tensorhub.reads.tensor_parallel`), the whole of
        the other tensors named in ``into`` (:func:`tensorhub.reads.fetch_slices`)."""
        return await reads.fetch_slices(
            self, model, version, into, slices, shard=shard, timeout=timeout
        )

    async def _fill_partial(self, replica: Replica, timeout: float) -> FetchResult:
        """Fill a partial read's replica: from this node's own copy if it holds the
        version, else from the swarm, without serving it."""
        local = self._held_complete(replica.key, replica.version, replica.manifest.root)
        if local is not None:
            return await copy_held(local, replica)

        # No endgame duplicates: each lands in chunk-sized scratch memory, and a partial
        # read promises memory bounded by its buffer.
        config = replace(self.node.dataplane.planner, endgame_copies=0)

        superseded = partial(self._moved_on, replica.key, replica.version)

        async def attempt(holders: list[Holder], left: float) -> FetchResult:
            return await swarm_fill(
                self.node,
                replica,
                holders,
                serve=False,
                timeout=left,
                config=config,
                superseded=superseded,
            )

        return await self._from_holders(replica.key, replica.version, timeout, attempt)

    def _held_complete(self, dp: str, version: int, root: bytes) -> Replica | None:
        """This node's replica of (dp, version), if it is whole and has ``root``."""
        try:
            local = self.node.store.get(dp, version)
        except UnknownVersion:
            return None
        return local if local.complete and local.manifest.root == root else None

    async def _free(self, into: Mapping[str, torch.Tensor], dp: str, version: int) -> None:
        """The mutability contract on the reading side: before a fetch writes into memory
        that serves another version, that version stops being served from it (drained).
        If it is the latest or a retained version and no lasting copy is left elsewhere,
        it goes on from a CPU copy of ours first, so it never silently disappears."""
        for r in self.node.sharing(into):
            if (r.key, r.version) == (dp, version):
                continue  # the same version again: copied locally by the fetch
            model, shard = split_key(r.key)
            if r.complete and await self._must_keep(model, r.version, r.key):
                await self._keep_copy(model, r.version, shard)
            else:
                await self._withdraw(r.key, r.version)

    async def manifest(
        self, model: str, version: int, *, shard: int = 0, timeout: float = 60.0
    ) -> Manifest:
        """The committed manifest of a version, from any holder (to allocate buffers once)."""
        root = await self._committed_root(model, version, shard)
        dp = shard_key(model, shard)
        with contextlib.suppress(UnknownVersion):
            here = self.node.store.get(dp, version).manifest
            if here.root == root:
                return here  # held (or being fetched) here: gossip lists only others

        async def attempt(holders: list[Holder], _left: float) -> Manifest:
            return await fetch_manifest(self.node, holders, dp, version, root)

        return await self._from_holders(dp, version, timeout, attempt)

    async def retain(self, model: str, version: int) -> None:
        """Keep (model, version) readable until :meth:`release` (it cannot be retired)."""
        await self._retention(Retain(model, version, self.node.name), "retain")

    async def release(self, model: str, version: int) -> None:
        await self._retention(Release(model, version, self.node.name), "release")
        if self._kept:
            await self._drop_kept(model)

    async def _retention(self, cmd: Retain | Release, op: str) -> None:
        res = await self.registry.propose(cmd)
        if not res.ok:
            raise UnknownVersion(f"{op} {cmd.model} v{cmd.version}: {res.code}: {res.message}")

    async def close(self) -> None:
        await self.gossip.stop()
        if self.raft is not None:
            await self.raft.stop()
        await self.node.close()


async def _check_secret(node: Node, seeds: Sequence[str]) -> None:
    """Fail fast on a wrong secret: dial the seeds (briefly, at once) and raise
    :class:`AuthenticationError` if every one that answered refused our secret. Without this
    a misconfigured node starts fine and its first registry call times out ~30 s later
    blaming the quorum. Seeds that are down or slow are no evidence either way: skipped."""
    others = [s for s in seeds if s != node.address]
    if not others:
        return
    dials = [asyncio.ensure_future(node.peer(s)) for s in others]
    done, pending = await asyncio.wait(dials, timeout=SECRET_PROBE_TIMEOUT)
    for d in pending:
        d.cancel()
    answered = [d for d in done if not d.cancelled()]
    refused = [e for d in answered if isinstance(e := d.exception(), AuthenticationError)]
    reached = [d for d in answered if d.exception() is None]
    if refused and not reached:
        raise AuthenticationError(
            f"{len(refused)} of {len(others)} seeds refused this node's secret: {refused[0]}"
        )


class SyncHub:
    """A blocking facade for code that is not async (most RL frameworks' workers): the Hub
    runs on its own thread and event loop, and each method blocks until its call is done.

    Every method takes ``timeout`` (seconds; None waits as long as the Hub's own limits
    allow). A call that runs past it is cancelled on the Hub's loop, and waited for, before
    :class:`DeadlineExceeded` is raised: nothing is left running behind the caller's back.
    Use it as a context manager, or call :meth:`close`."""

    def __init__(self, **start_kwargs: Any) -> None:
        from .io.loop import new_loop

        self._loop = new_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="tensorhub"
        )
        self._thread.start()
        try:
            self.hub: Hub = self._call(Hub.start(**start_kwargs))
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        async def bounded() -> T:
            if timeout is None:
                return await coro
            try:
                return await asyncio.wait_for(coro, timeout)
            except asyncio.TimeoutError:
                raise DeadlineExceeded(f"no answer within {timeout:g}s; cancelled") from None

        fut: Future[T] = asyncio.run_coroutine_threadsafe(bounded(), self._loop)
        try:
            return fut.result()
        except BaseException:
            # Interrupted (e.g. KeyboardInterrupt) while waiting: stop the call on the loop.
            if not fut.done():
                self._loop.call_soon_threadsafe(fut.cancel)
            raise

    def __enter__(self) -> SyncHub:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def address(self) -> str:
        return self.hub.address

    def publish(
        self,
        model: str,
        version: int,
        tensors: Mapping[str, torch.Tensor],
        *,
        timeout: float | None = None,
        **kw: Any,
    ) -> Published:
        return self._call(self.hub.publish(model, version, tensors, **kw), timeout)

    def wait_replicated(
        self, model: str, version: int, *, copies: int = 1, shard: int = 0, timeout: float = 60.0
    ) -> None:
        self._call(
            self.hub.wait_replicated(model, version, copies=copies, shard=shard, timeout=timeout)
        )

    def unpublish(
        self, model: str, version: int, *, timeout: float | None = None, **kw: Any
    ) -> bool:
        return self._call(self.hub.unpublish(model, version, **kw), timeout)

    def latest(self, model: str, *, timeout: float = DEFAULT_DEADLINE) -> int:
        return self._call(self.hub.latest(model, timeout=timeout))

    def watch(
        self, model: str, *, poll: float = 0.2, timeout: float | None = None
    ) -> Iterator[int]:
        """Committed versions of ``model`` as they appear; ``timeout`` bounds the wait for
        each next one (:class:`DeadlineExceeded`). Closing the iterator stops the watch."""
        agen = self.hub.watch(model, poll)
        try:
            while True:
                yield self._call(agen.__anext__(), timeout)
        finally:
            if not self._loop.is_closed():  # else it went with the loop
                self._call(agen.aclose())

    def manifest(
        self, model: str, version: int, *, shard: int = 0, timeout: float = 60.0
    ) -> Manifest:
        return self._call(self.hub.manifest(model, version, shard=shard, timeout=timeout))

    def latest_held(
        self, model: str, at_least: int, *, shard: int = 0, timeout: float = DEFAULT_DEADLINE
    ) -> int:
        return self._call(self.hub.latest_held(model, at_least, shard=shard, timeout=timeout))

    def fetch(
        self,
        model: str,
        version: int | None,
        into: Mapping[str, torch.Tensor],
        *,
        at_least: int | None = None,
        shard: int = 0,
        timeout: float = 60.0,
    ) -> FetchResult:
        return self._call(
            self.hub.fetch(model, version, into, at_least=at_least, shard=shard, timeout=timeout)
        )

    def stream(
        self,
        model: str,
        version: int,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        shard: int = 0,
        timeout: float = 60.0,
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """:meth:`Hub.stream`, blocking: each bucket's tensors view a buffer the next
        bucket reuses (copy them before the next step). Closing the iterator ends the read."""
        agen = self.hub.stream(
            model, version, bucket_bytes=bucket_bytes, shard=shard, timeout=timeout
        )

        async def step() -> list[tuple[str, torch.Tensor]] | None:
            try:
                return await anext(agen)
            except StopAsyncIteration:
                return None

        try:
            while (bucket := self._call(step())) is not None:
                yield bucket
        finally:
            if not self._loop.is_closed():
                self._call(agen.aclose())

    def fetch_slices(
        self,
        model: str,
        version: int,
        into: Mapping[str, torch.Tensor],
        slices: Mapping[str, reads.TensorSlice],
        *,
        shard: int = 0,
        timeout: float = 60.0,
    ) -> FetchResult:
        return self._call(
            self.hub.fetch_slices(model, version, into, slices, shard=shard, timeout=timeout)
        )

    def retain(self, model: str, version: int, *, timeout: float | None = None) -> None:
        self._call(self.hub.retain(model, version), timeout)

    def release(self, model: str, version: int, *, timeout: float | None = None) -> None:
        self._call(self.hub.release(model, version), timeout)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self.hub.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


W = TypeVar("W")


def _register(
    table: dict[tuple[str, int], list[W]], key: tuple[str, int], fn: W
) -> Callable[[], None]:
    """Add ``fn`` to ``table[key]``; returns what removes it (and the key, once empty)."""
    table.setdefault(key, []).append(fn)

    def unregister() -> None:
        fns = table.get(key, [])
        if fn in fns:
            fns.remove(fn)
        if not fns:
            table.pop(key, None)

    return unregister


class _GossipView:
    """The node's :class:`~tensorhub.dataplane.view.ClusterView`, answered from the Hub's
    gossip (given to the node before the Hub exists: until then it knows nothing)."""

    def __init__(self) -> None:
        self.hub: Hub | None = None

    def near(self, peer: str) -> bool:
        return self.hub is not None and self.hub._near(peer)

    def seed_context(self, peer: str) -> SeedContext:
        return NO_CONTEXT if self.hub is None else self.hub._seed_context(peer)

    def lagging(self, key: ShardKey, version: int, name: str) -> bool:
        return self.hub is not None and self.hub._lagging(key, version, name)

    def lagged_before(self, key: ShardKey) -> frozenset[str]:
        return frozenset() if self.hub is None else self.hub._lagged_before(key)

    def ucx_route(self, addr: str) -> str | None:
        return None if self.hub is None else self.hub._ucx_route(addr)

    def sources(self, model: str, version: int) -> SourceNews:
        return (
            NO_NEWS
            if self.hub is None
            else self.hub._sources(model, version, None, self.hub._health())
        )

    def watch_sources(
        self, model: str, version: int, tell: Callable[[SourceNews], None]
    ) -> Callable[[], None]:
        if self.hub is None:
            return lambda: None
        return self.hub._watch_sources(model, version, tell)

    def locate(self, name: str) -> tuple[str, int] | None:
        return None if self.hub is None else self.hub._locate(name)

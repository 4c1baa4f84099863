"""One node's asyncio driver: its listener, its connections and what it holds.

Everything that touches the network for a node goes through here, so later layers (Raft,
gossip, the swarm) plug into one place. This first version serves the versions it holds and
fetches whole versions from a named peer.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TypeVar

import torch

from ..core.errors import ChecksumMismatch, TransferError, UnknownVersion
from ..core.layout import DEFAULT_ALIGN, DEFAULT_CHUNK_SIZE
from ..core.manifest import Applied, Manifest
from ..core.messages import Behind, Have, Message
from ..core.naming import ShardKey, display_name
from ..core.swarm import SuperSeeder
from ..core.swarm.presets import NODE, DataPlaneConfig
from ..core.swarm.serve import SeedContext, past_laggards
from ..io import tcp, ucx
from ..io.shaping import WanShaper
from ..io.tensors import TensorBytes, build_manifest, copy_chunk, empty_like_manifest
from .fetch import DEFAULT_WINDOW, FetchResult, fetch_version
from .peer import ControlHandler, PeerHandler
from .store import LocalStore, Replica
from .upload_grants import UploadGrants
from .view import ClusterView, Unaware

log = logging.getLogger(__name__)


def resolve_secret(secret: bytes | str | None) -> bytes:
    """The cluster secret: given, or from ``TENSORHUB_SECRET``; never empty."""
    if secret is None:
        secret = os.environ.get("TENSORHUB_SECRET")
    if not secret:
        raise ValueError(
            "a cluster secret is required: set TENSORHUB_SECRET (or pass secret=, or "
            "--secret-file on the command line)"
        )
    return secret.encode() if isinstance(secret, str) else bytes(secret)


TRANSPORTS = ("auto", "tcp", "ucx")


def want_ucx(transport: str | None) -> bool:
    """Whether a node also listens on UCX: ``transport`` (or ``TENSORHUB_TRANSPORT``):
    "tcp" never; "ucx" always (an error if no binding is installed); "auto" (the default)
    when a binding is installed and there is something for UCX to be faster on — an RDMA
    device or a GPU. Over plain loopback or Ethernet our TCP path is the faster one."""
    transport = transport or os.environ.get("TENSORHUB_TRANSPORT", "auto")
    if transport not in TRANSPORTS:
        raise ValueError(f"transport {transport!r} is not one of {TRANSPORTS}")
    if transport == "tcp":
        return False
    if transport == "ucx":
        if not ucx.available():
            raise RuntimeError("transport 'ucx' needs ucxx: pip install 'tensorhub[ucx]'")
        return True
    return ucx.available() and ucx.worthwhile()


def prepare_serving(
    tensors: Mapping[str, torch.Tensor],
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    align: int = DEFAULT_ALIGN,
    transforms: Sequence[Applied] = (),
) -> tuple[TensorBytes, Manifest]:
    """The work of serving ``tensors`` that touches no node state, so it may run in a
    thread: their bytes (device tensors copied to pinned host memory) and the manifest,
    every chunk hashed. On the event loop, hashing 1 GiB held it for about a tenth of a
    second on this 2-core host; a model of 100 GB would hold it for many seconds, longer
    than gossip waits before it takes a silent node for dead."""
    data = TensorBytes.from_state_dict(tensors, chunk_size, align)
    return data, build_manifest(data, transforms)


class Node:
    """A tensorhub peer: serves what it holds, fetches from others.

    Every node listens on TCP (its address, its identity). With UCX it listens there too
    (:attr:`ucx_address`); a connection to a peer goes over UCX when :attr:`view` names
    that peer's UCX address — the layer that knows where peers are decides (the Hub: same
    datacenter, both ends with UCX) — and over TCP otherwise.
    """

    def __init__(
        self,
        name: str,
        secret: bytes,
        view: ClusterView | None = None,
        dataplane: DataPlaneConfig = NODE,
    ) -> None:
        self.name = name
        self.dataplane = dataplane
        """Upload slots and queue limits (here), the fetch planner's settings (swarm.py)."""
        self._secret = secret
        self.store = LocalStore()
        self._server: tcp.Server | None = None
        self._ucx_server: ucx.UcxServer | None = None
        self._ucx_failed: set[str] = set()
        self.view: ClusterView = view or Unaware()
        """Where peers are (rack, datacenter, UCX address): the one delegate the data
        plane asks (the Hub's is gossip's; a bare node's knows nothing)."""
        self._peers: dict[str, PeerHandler] = {}
        self._control: dict[str, PeerHandler] = {}  # control-plane connections, by address
        self._dialing: dict[str, asyncio.Task[PeerHandler]] = {}
        self.handlers: set[PeerHandler] = set()
        self.control: dict[type[Message], ControlHandler] = {
            Have: self._on_have,
            Behind: self._on_behind,
        }
        """Handlers for control-plane messages (Raft, registry requests), by type."""
        self._have_watchers: dict[tuple[str, int], Callable[[str, list[int]], None]] = {}
        self._behind_watchers: dict[tuple[str, int], Callable[[str], None]] = {}
        # (late-bound: a test or tool may replace the view after start)
        self.upload_grants = UploadGrants(
            dataplane.upload_slots,
            dataplane.max_waiting,
            dataplane.near_waiting,
            dataplane.uploads_per_peer,
            near=lambda peer: self.view.near(peer),  # noqa: PLW0108
        )
        self.shaper: WanShaper | None = None
        """WAN emulation (off unless set: the launcher sets it from a topology)."""

    @classmethod
    async def start(
        cls,
        name: str,
        *,
        listen: str = "127.0.0.1:0",
        secret: bytes | str | None = None,
        transport: str | None = None,
        view: ClusterView | None = None,
        dataplane: DataPlaneConfig = NODE,
    ) -> Node:
        """Listen on ``listen`` (TCP) and, if :func:`want_ucx` says so, on UCX (a free port
        on the same host)."""
        node = cls(name, resolve_secret(secret), view, dataplane)
        node._server = await tcp.listen(
            listen, node=name, secret=node._secret, handler_factory=node._handler
        )
        if want_ucx(transport):
            host, _port = tcp.parse_address(node._server.address)
            try:
                node._ucx_server = await ucx.listen(
                    f"{host}:0", node=name, secret=node._secret, handler_factory=node._handler
                )
            except BaseException:
                await node.close()
                raise
        return node

    @property
    def address(self) -> str:
        assert self._server is not None, "node not started"
        return self._server.address

    @property
    def ucx_address(self) -> str | None:
        """Where this node takes UCX connections (None: TCP only)."""
        return self._ucx_server.address if self._ucx_server is not None else None

    def _handler(self, conn: tcp.Connection) -> PeerHandler:
        h = PeerHandler(
            conn,
            self.store,
            self.control,
            self.upload_grants,
            self._seed_context,
            lambda: self.shaper,
            cut_through=self.dataplane.cut_through,
            park_starting=self.dataplane.park_starting,
            address=lambda: self.address,
            spread_after=self.dataplane.spread_after,
            restart_cc_after=self.dataplane.restart_cc_after,
        )
        self.handlers.add(h)
        conn.closed.add_done_callback(lambda _f: self.handlers.discard(h))
        return h

    def _seed_context(self, peer: str, replica: Replica, asker_lagging: bool) -> SeedContext:
        """What a super-seeding origin knows of ``peer``: the view's, without the relay
        links that fell behind on this version as recipients to send it to (see
        serve.past_laggards)."""
        key, version, told = replica.key, replica.version, replica.laggards
        return past_laggards(
            self.view.seed_context(peer),
            asker_lagging,
            lambda g: g in told or self.view.lagging(key, version, g),
        )

    # -- Have: chunk news between the peers of one version's swarm ---------------------------

    def watch_haves(
        self, key: ShardKey, version: int, seen: Callable[[str, list[int]], None]
    ) -> Callable[[], None]:
        """Call ``seen(addr, chunks)`` for each Have about (key, version) until the
        returned function is called (a fetch in progress listens)."""
        return _watch(self._have_watchers, (key, version), seen)

    def _on_have(self, _peer: PeerHandler, msg: Message) -> None:
        assert isinstance(msg, Have)
        seen = self._have_watchers.get((msg.key, msg.version))
        if seen is not None:
            seen(msg.addr, msg.chunks)

    def watch_behind(
        self, key: ShardKey, version: int, told: Callable[[str], None]
    ) -> Callable[[], None]:
        """Call ``told(peer)`` for each Behind about (key, version) until the returned
        function is called (a fetch in progress listens: it may be a chain's head)."""
        return _watch(self._behind_watchers, (key, version), told)

    def _on_behind(self, peer: PeerHandler, msg: Message) -> None:
        assert isinstance(msg, Behind)
        if msg.who:  # we are the origin: send no asker to that head (Behind.who)
            try:
                replica = self.store.get(msg.key, msg.version)
            except UnknownVersion:
                return
            if replica.seeder is not None and len(replica.laggards) < MAX_LAGGARDS:
                replica.laggards.add(msg.who)
            return
        told = self._behind_watchers.get((msg.key, msg.version))
        if told is not None:
            told(peer.conn.peer or "?")

    def peer_name(self, addr: str) -> str | None:
        """The name the peer at ``addr`` authenticated as, if we are connected to it (what
        its requests, and a super-seeding origin's recipients, name it by)."""
        h = self._peers.get(addr)
        return None if h is None else h.conn.peer

    def tell_behind(self, addr: str, key: ShardKey, version: int, who: str = "") -> bool:
        """Tell the peer at ``addr`` it is a slow chain head (Behind), or, with ``who``,
        that ``who`` is one (the origin); on the connection we fetch from it over. Whether
        there was one (never dials: we have fetched from both)."""
        h = self._peers.get(addr)
        if h is None or h.conn.is_closing:
            return False
        h.tell_behind(key, version, who)
        return True

    def refuse_queued(self, replica: Replica) -> int:
        """``replica``'s fetch fell behind: every connection answers "busy" for the chunk
        replies of it queued for a peer that does not lag (``PeerHandler.refuse_queued``).
        How many it answered so."""
        return sum(h.refuse_queued(replica) for h in list(self.handlers))

    def announce(self, key: ShardKey, version: int, chunk: int, to: Iterable[str]) -> None:
        """Tell the swarm of (key, version) we hold ``chunk`` now: the peers at the
        addresses ``to`` we are connected to, and every peer that asked us for the
        version. Never dials: a peer we have no connection to learns it by gossip."""
        told: set[PeerHandler] = set()
        for addr in to:
            h = self._peers.get(addr)
            if h is not None:
                told.add(h)
        told |= {h for h in self.handlers if (key, version) in h.asked_for}
        for h in told:
            h.tell_have(key, version, self.address, chunk)

    async def peer(self, addr: str) -> PeerHandler:
        """An open connection to ``addr`` for chunks (one per address, dialled on first
        use)."""
        h = self._peers.get(addr)
        if h is not None and not h.conn.is_closing and not self._better_route(addr, h):
            return h
        return await self._dial_once(addr, lambda: self._dial(addr))

    async def control_peer(self, addr: str) -> PeerHandler:
        """An open TCP connection to ``addr`` for control messages (gossip, Raft, the
        registry), apart from the one that carries chunks: a gossip probe queued behind
        megabytes of chunk payload on a saturated NIC missed its ack deadline, the holder
        was declared dead, and every fetch dropped it (``bench/linerate.py``, 8 receivers
        on 1 Gbit/s NICs: a tenth of the run with no byte moving)."""
        h = self._control.get(addr)
        if h is not None and not h.conn.is_closing:
            return h
        return await self._dial_once(f"control:{addr}", lambda: self._dial(addr, True))

    async def _dial_once(self, key: str, dial: Callable[[], Awaitable[PeerHandler]]) -> PeerHandler:
        """One dial in flight per ``key``, shared by everyone waiting for it."""
        pending = self._dialing.get(key)
        if pending is None:
            # The dial is its own task: a requester that gives up does not cancel it for
            # the others waiting on the same connection.
            pending = self._dialing[key] = asyncio.ensure_future(dial())
            pending.add_done_callback(lambda f: self._dial_done(key, f))
        return await asyncio.shield(pending)

    def _dial_done(self, key: str, f: asyncio.Task[PeerHandler]) -> None:
        self._dialing.pop(key, None)
        if not f.cancelled():
            f.exception()  # retrieved: each waiter gets it; none may be left to log it

    def _route(self, addr: str) -> str | None:
        if self.ucx_address is None or addr in self._ucx_failed:
            return None
        return self.view.ucx_route(addr)

    def _better_route(self, addr: str, h: PeerHandler) -> bool:
        """A TCP connection made before we learnt the peer's UCX address (gossip dials
        early) gives way to UCX; it stays open for what is in flight on it."""
        return not isinstance(h.conn, ucx.UcxConnection) and self._route(addr) is not None

    async def _dial(self, addr: str, control: bool = False) -> PeerHandler:
        """Connect to ``addr``: for chunks over UCX where the view names a route, else (and
        for ``control`` messages always) over TCP."""
        route = None if control else self._route(addr)
        conn: tcp.Connection | None = None
        if route is not None:
            try:
                conn = await ucx.connect(
                    route, node=self.name, secret=self._secret, handler_factory=self._handler
                )
            except TransferError as e:  # UCX cannot reach it: TCP can, and will from now on
                log.warning("%s: UCX to %s failed (%s); using TCP", self.name, route, e)
                self._ucx_failed.add(addr)
        if conn is None:
            conn = await tcp.connect(
                addr, node=self.name, secret=self._secret, handler_factory=self._handler
            )
        handler = conn.handler
        assert isinstance(handler, PeerHandler)
        (self._control if control else self._peers)[addr] = handler
        return handler

    def serve(
        self,
        key: ShardKey,
        version: int,
        tensors: Mapping[str, torch.Tensor],
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        align: int = DEFAULT_ALIGN,
        super_seed: float | None = None,
        seed_spare: bool = True,
        transforms: Sequence[Applied] = (),
    ) -> Manifest:
        """Hold ``tensors`` as (key, version) and serve them (no copy is made of
        contiguous CPU tensors: they must not change until :meth:`withdraw` returns;
        device tensors are copied to pinned host memory here and may change at once).

        ``super_seed``: serve as the origin, each chunk once before any twice (a chunk is
        sent again only after its requests were refused for this many seconds, or at once
        while our uplink has idle slots unless ``seed_spare`` is False: set that where the
        NIC also carries training traffic).

        This hashes every byte here, on the caller's thread; an event loop that must keep
        answering (gossip, Raft, uploads) runs :func:`prepare_serving` in a thread and
        hands its result to :meth:`serve_prepared`, as ``Hub.publish`` does."""
        data, manifest = prepare_serving(tensors, chunk_size, align, transforms)
        return self.serve_prepared(
            key, version, data, manifest, super_seed=super_seed, seed_spare=seed_spare
        )

    def serve_prepared(
        self,
        key: ShardKey,
        version: int,
        data: TensorBytes,
        manifest: Manifest,
        *,
        super_seed: float | None = None,
        seed_spare: bool = True,
    ) -> Manifest:
        """Serve what :func:`prepare_serving` made (see :meth:`serve`): from this moment
        peers may fetch it."""
        replica = Replica(key, version, manifest, data)
        if super_seed is not None:
            replica.seeder = SuperSeeder(manifest.num_chunks, super_seed, seed_spare)
        replica.have[:] = b"\x01" * manifest.num_chunks
        self.store.add(replica)
        return manifest

    async def keep_copy(self, key: ShardKey, version: int) -> None:
        """Go on serving (key, version) from a private CPU copy instead of the caller's
        tensors; returns once no upload reads the caller's memory any more.

        The copy is verified chunk by chunk against the manifest, so a publisher that broke
        the mutability contract is caught here instead of serving wrong bytes."""
        old = self.store.get(key, version)
        m = old.manifest

        def copy() -> TensorBytes:
            # (allocated and zeroed here too: zeroing a model's worth of memory on the
            # event loop silences gossip for seconds, longer than peers wait before they
            # take a silent node for dead)
            data = TensorBytes.for_destination(m, empty_like_manifest(m))
            for i in range(m.num_chunks):
                if not copy_chunk(old.data, data, m, i):
                    raise ChecksumMismatch(
                        f"{display_name(key)} v{version} chunk {i} changed while published "
                        "(the buffer must not change until unpublish returns)"
                    )
            return data

        data = await asyncio.to_thread(copy)
        data.finalize()
        data.borrowed = False  # ours: it stays until we let it go
        new = Replica(key, version, m, data, bytearray(old.have), seeder=old.seeder)
        self.store.replace(new)
        await old.drained()

    def sharing(self, tensors: Mapping[str, torch.Tensor]) -> list[Replica]:
        """Replicas whose bytes live in (or are served from) any of ``tensors``' memory."""
        ts = list(tensors.values())
        return [r for r in self.store if r.data.shares_memory(ts)]

    async def withdraw(self, key: ShardKey, version: int) -> None:
        """Stop serving (key, version); returns once no upload reads its memory."""
        replica = self.store.remove(key, version)
        await replica.drained()

    async def fetch(
        self,
        addr: str,
        key: ShardKey,
        version: int,
        into: Mapping[str, torch.Tensor],
        *,
        expected_root: bytes | None = None,
        window: int = DEFAULT_WINDOW,
        hold: bool = True,
    ) -> FetchResult:
        """Fetch a whole version from the peer at ``addr``; then (if ``hold``) serve it too."""
        peer = await self.peer(addr)
        replica, result = await fetch_version(
            peer, key, version, into, expected_root=expected_root, window=window
        )
        if hold:
            self.store.add(replica)
        return result

    async def close(self) -> None:
        # No new connections first, either way: a dial still in flight, or a peer accepted
        # meanwhile, would otherwise leave a connection open after the loop below (both of
        # its sockets, where the peer runs in this process).
        dials = list(self._dialing.values())
        for d in dials:
            d.cancel()
        await asyncio.gather(*dials, return_exceptions=True)
        if self._server is not None:
            await self._server.close()
        if self._ucx_server is not None:
            await self._ucx_server.close()
        # Together: each may wait CLOSE_GRACE for a peer that reads nothing.
        await asyncio.gather(*(h.aclose() for h in list(self.handlers)))


W = TypeVar("W")

MAX_LAGGARDS = 64
"""Heads an origin's replica remembers as found slow (Behind.who): a fetch finds at most
one; the bound keeps a confused or hostile peer from growing the set."""


def _watch(table: dict[tuple[str, int], W], watch: tuple[str, int], cb: W) -> Callable[[], None]:
    """Register ``cb`` in ``table`` under ``watch``; returns what unregisters it (only
    if it is still the one registered: a later fetch of the same version may replace it)."""
    table[watch] = cb

    def stop() -> None:
        if table.get(watch) is cb:
            del table[watch]

    return stop

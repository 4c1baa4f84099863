"""The data-plane protocol on one connection, in both directions.

Either end of a connection may ask the other for manifests and chunks, and answers the
other's requests from its :class:`~tensorhub.dataplane.store.LocalStore`. Replies go out in request
order through one writer task per connection, which applies backpressure and counts a
replica's upload as finished only once its bytes left our buffers (uvloop sends memoryviews
by reference, so that is when the publisher's memory is no longer read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..core.digest import RunningDigest
from ..core.errors import (
    ChecksumMismatch,
    ProtocolError,
    Refused,
    RemoteError,
    TransferError,
    UnknownVersion,
)
from ..core.manifest import Manifest
from ..core.messages import (
    Behind,
    Cancel,
    ChunkData,
    Error,
    GetChunk,
    GetManifest,
    Have,
    ManifestData,
    Message,
    Redirect,
)
from ..core.naming import ShardKey
from ..core.swarm import SeedDecision, holder_seeder
from ..core.swarm.serve import NO_CONTEXT, SeedContext, Verdict, serve_decision
from ..io.shaping import WanShaper
from ..io.tcp import Connection
from .store import Landing, LocalStore, Replica
from .upload_grants import Grant, UploadGrants

log = logging.getLogger(__name__)

ControlHandler = Callable[["PeerHandler", Message], None]
"""Receives a control-plane message (Raft, registry, gossip) that arrived on a connection."""

SeedView = Callable[[str, Replica, bool], SeedContext]
"""For a super-seeding origin: (requesting node, replica, whether the requester is a relay
link that fell behind) → what it needs to know of the requester (the node's
:class:`~tensorhub.dataplane.view.ClusterView`)."""

MAX_QUEUED_REQUESTS = 512
"""Requests a peer may have queued on us at once; more is a protocol violation."""

VERIFY_OFF_LOOP = 1 << 20
"""What is left to hash of a chunk once it is in (all of it, unless it was hashed as it
landed: ``HASH_INLINE_RATE``): at least this much is hashed on a worker thread (BLAKE3
releases the GIL), so the event loop goes on receiving the next chunks meanwhile; less is
hashed inline, where a thread hop would cost more than the hash."""

HASH_INLINE_RATE = 250e6
"""Bytes a second up to which a chunk arriving in pieces is hashed piece by piece on the
event loop as they land, so that its last piece is all that is left to hash once it is
in, and its verdict needs no thread hop. A relay holds a chunk's last piece back until
the chunk verified (``_stream``): hashed whole on a worker thread once in, a 4 MiB chunk
verified 1.6-1.8 ms (median) after its last byte with the cores a third busy, and 4-7 ms
(10-12 at the 90th percentile) with nine processes on two cores (bench/linerate.py, N=3
and N=8, 256 MiB, 1 Gbit/s), once per hop; hashed as it landed, 0.2-0.4 ms (healthy N=8
1.077-1.084x one copy against 1.090-1.091x: docs/results.md, session 39). At this rate
(2 Gbit/s) hashing takes a few percent of the loop; a faster link sends whole chunks
(``io.send_queue.MAX_QUEUE``) or pieces faster than this, which the worker thread hashes
as before."""
HASH_INLINE_PIECE = 1 << 20
"""The most bytes hashed on the event loop at once, as a piece lands (a quarter of a
millisecond)."""

_verifiers = ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1)), "tensorhub-verify")

PIECE = 256 * 1024
"""Cut through: bytes that must have landed past what we sent before the next piece goes
out, and the tail kept back until the chunk verified here. Smaller pieces trail the
upstream more closely but cost a frame each (a 4 MiB chunk goes in about 16)."""


def byte_range(parts: Sequence[memoryview], start: int, stop: int) -> list[memoryview]:
    """Bytes ``start:stop`` of the concatenation of ``parts``, as views of them."""
    out, pos = [], 0
    for p in parts:
        n = len(p)
        lo, hi = max(start - pos, 0), min(stop - pos, n)
        if lo < hi:
            out.append(p[lo:hi])
        pos += n
        if pos >= stop:
            break
    return out


def _cancelled(rid: int) -> Error:
    """The one frame that ends a request its asker gave up (Cancel) before its chunk went."""
    return Error("cancelled", "request cancelled", rid)


@dataclass
class _Request:
    fut: asyncio.Future[object]
    chunk: int = -1
    replica: Replica | None = None
    parts: list[memoryview] = field(default_factory=list)
    expected_root: bytes | None = None
    abandoned: bool = False  # its reply is read and dropped; its memory is not touched
    arriving: Callable[[], None] | None = None  # told when its payload begins to arrive
    primary: bool = False  # into the replica's own memory (not an endgame copy's scratch)
    received: int = 0  # bytes of the chunk received so far (a reply may come in pieces)
    sent: bool = False  # the request went out (a reply will come)
    landing: Landing | None = None  # into the replica's own memory: others may stream it
    digest: RunningDigest | None = None  # its bytes hashed so far, while it comes slowly
    began: float = 0.0  # when its payload began to arrive


@dataclass
class _Reply:
    msg: Message
    replica: Replica | None = None
    chunk: int = -1
    grant: Grant | None = None
    landing: Landing | None = None  # the chunk is not verified here yet: cut through
    asker_lagging: bool = False  # the peer relays from the chain's tail too (GetChunk.lagging)


class PeerHandler:
    """Serves and fetches manifests and chunks over one authenticated connection."""

    def __init__(
        self,
        conn: Connection,
        store: LocalStore,
        control: Mapping[type[Message], ControlHandler] | None = None,
        grants: UploadGrants | None = None,
        seed_context: SeedView | None = None,
        shaper: Callable[[], WanShaper | None] | None = None,
        cut_through: bool = False,
        park_starting: bool = False,
        address: Callable[[], str] | None = None,
        spread_after: float | None = None,
        restart_cc_after: float = 0.0,
    ) -> None:
        self.conn = conn
        self.restart_cc_after = restart_cc_after
        """A chunk sent after this many seconds without one begins the connection's
        congestion control afresh (0: never; presets: restart_cc_after)."""
        self._chunk_sent_at = time.monotonic()  # when the last chunk reply ended (or we began)
        self.cut_through = cut_through  # serve a chunk while it lands (presets: cut_through)
        self.park_starting = park_starting  # (presets: park_starting; Replica.starting)
        self.spread_after = spread_after
        """Fetched copies super-seed too, with this ``reserve_after`` (None: only origins;
        presets: every_holder_seeds)."""
        self._address = address  # ours, as our Have messages name us
        self.store = store
        self._control = control or {}
        self._grants = grants or UploadGrants()
        self._seed_context = seed_context
        self._shaper = shaper or (lambda: None)
        self._unflushed: deque[tuple[int, Replica, Grant]] = deque()
        self._flusher: asyncio.Task[None] | None = None
        self._next_req = 1
        self._pending: dict[int, _Request] = {}
        self._out: deque[_Reply] = deque()
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self.chunks_served = 0
        self.bytes_served = 0
        self.chunks_cut_through = 0  # of chunks_served: sent while they landed here
        self._receiving: int | None = None  # the request whose chunk payload is arriving
        self._haves: dict[tuple[str, int, str], list[int]] = {}  # to tell, not yet sent
        self._notes: list[Message] = []  # small frames to send ahead of replies (Cancel, ...)
        self._parked: set[int] = set()  # the peer's requests parked here until chunks land
        self._cancelled: set[int] = set()  # of the peer's parked or queued: given up
        self.asked_for: set[tuple[str, int]] = set()
        """(key, version) the peer asked us for: it is in that version's swarm."""

    @property
    def requests_open(self) -> int:
        """Our requests on this connection whose reply has not ended yet (given-up ones
        included: each still gets its one ending frame)."""
        return len(self._pending)

    # -- Handler interface ---------------------------------------------------------------

    def on_frame(
        self, conn: Connection, msg: Message, payload_len: int
    ) -> Sequence[memoryview] | None:
        if isinstance(msg, GetChunk | GetManifest):
            if (msg.key, msg.version) not in self.asked_for:
                self.asked_for.add((msg.key, msg.version))
                self._tell_held(msg.key, msg.version)
            self._queue_reply(msg)
            return None
        if isinstance(msg, Cancel):
            self._cancel(msg.req)
            return None
        handler = self._control.get(type(msg))
        if handler is not None:
            handler(self, msg)
            return None
        if isinstance(msg, ChunkData):
            return self._chunk_sink(msg, payload_len)
        if isinstance(msg, ManifestData):
            if msg.req not in self._pending:
                raise ProtocolError(f"unsolicited manifest reply req={msg.req}")
            return None
        if isinstance(msg, Redirect):
            req = self._pending.pop(msg.req, None)
            if req is not None and not req.fut.done():
                req.fut.set_exception(Refused(conn.peer, msg.chunk, msg.holders))
            return None
        if isinstance(msg, Error):
            if msg.req is None:
                log.warning("peer %s: %s: %s", conn.peer, msg.code, msg.message)
                return None
            req = self._pending.pop(msg.req, None)
            if req is not None and not req.fut.done():
                req.fut.set_exception(RemoteError(conn.peer, msg.code, msg.message))
            return None
        raise ProtocolError(f"unexpected {type(msg).__name__} on this connection")

    def _chunk_sink(self, msg: ChunkData, payload_len: int) -> Sequence[memoryview] | None:
        """Where a chunk reply's bytes go: the asker's memory at their offset (None: a
        throwaway buffer, for a request we abandoned)."""
        req = self._pending.get(msg.req)
        if req is None or req.replica is None:
            raise ProtocolError(f"unsolicited chunk reply req={msg.req}")
        size = sum(len(p) for p in req.parts)
        end = msg.offset + payload_len
        if (
            msg.chunk != req.chunk
            or msg.offset != req.received
            or end > size
            or msg.last != (end == size)
        ):
            raise ProtocolError(
                f"chunk reply req={msg.req} is chunk {msg.chunk} bytes {msg.offset}:{end}"
                f"{' (last)' if msg.last else ''}; asked for chunk {req.chunk} of {size} "
                f"bytes, {req.received} received"
            )
        if req.abandoned:
            return None  # read into a throwaway buffer
        self._receiving = msg.req
        if msg.offset == 0:
            req.digest, req.began = RunningDigest(), time.monotonic()
            if req.arriving is not None:
                req.arriving()
            if req.primary:
                req.landing = req.replica.begin_landing(req.chunk)
        return byte_range(req.parts, msg.offset, end)

    def on_progress(self, conn: Connection, landed: int) -> None:
        if self._receiving is not None:
            req = self._pending.get(self._receiving)
            if req is not None and req.landing is not None and not req.abandoned:
                req.landing.advance(req.received + landed)

    def on_payload(self, conn: Connection, msg: Message, parts: Sequence[memoryview]) -> None:
        assert isinstance(msg, ChunkData | ManifestData)
        self._receiving = None
        if isinstance(msg, ChunkData) and not msg.last:  # a piece: more of the chunk follows
            req = self._pending.get(msg.req)
            if req is not None:
                req.received += sum(len(p) for p in parts)
                if not req.abandoned:
                    self._hash_piece(req, req.received)
                if req.landing is not None and not req.abandoned:
                    req.landing.advance(req.received)
            return
        req = self._pending.pop(msg.req, None)
        if req is None or req.fut.done() or req.abandoned:
            return
        if isinstance(msg, ChunkData):
            size = sum(len(p) for p in req.parts)
            if req.landing is not None:
                req.landing.advance(size)
            running = req.digest
            if running is None:  # (none began: _chunk_sink makes one at the first frame)
                running = RunningDigest()
            elif self._hash_piece(req, size):
                self._verified(conn.peer, req, running.digest())
                return
            rest = byte_range(req.parts, running.fed, size)
            if size - running.fed < VERIFY_OFF_LOOP:
                self._verified(conn.peer, req, running.finish(rest))
            else:
                hashing = asyncio.get_running_loop().run_in_executor(
                    _verifiers, running.finish, rest
                )
                hashing.add_done_callback(
                    lambda f: self._verified(
                        conn.peer, req, None if f.cancelled() or f.exception() else f.result()
                    )
                )
            return
        try:
            manifest = Manifest.decode(bytes(parts[0]) if parts else b"", req.expected_root)
            if manifest.root != msg.root:
                raise ProtocolError("manifest reply root does not match its bytes")
        except Exception as e:
            req.fut.set_exception(e)
        else:
            req.fut.set_result(manifest)

    @staticmethod
    def _hash_piece(req: _Request, landed: int) -> bool:
        """Hash what landed of a chunk (its first ``landed`` bytes) and is not hashed yet,
        here on the event loop, if that is at most ``HASH_INLINE_PIECE`` and the chunk's
        payload has come no faster than ``HASH_INLINE_RATE`` since it began (a busy
        process reads pieces that queued meanwhile in a burst: their pace is the link's,
        not the burst's). Else leave it to be hashed once the chunk is in. Whether all
        that landed is hashed."""
        running = req.digest
        if running is None:
            return False
        backlog = landed - running.fed
        if backlog > HASH_INLINE_PIECE:
            return False
        if landed > HASH_INLINE_RATE * (time.monotonic() - req.began):
            return backlog == 0
        running.update(byte_range(req.parts, running.fed, landed))
        return True

    @staticmethod
    def _verified(peer: str | None, req: _Request, got: bytes | None) -> None:
        """A chunk's payload was hashed: the request succeeds only if it matches the
        committed digest (its payload carried no MAC, so this is its only check)."""
        if req.fut.done():  # cancelled (abandoned) while it was being hashed
            return
        assert req.replica is not None
        want = req.replica.manifest.digests[req.chunk]
        if got != want:
            req.fut.set_exception(
                ChecksumMismatch(
                    f"chunk {req.chunk} of {req.replica.key} v{req.replica.version} from "
                    f"{peer}: digest {got.hex() if got else '?'} != manifest {want.hex()}"
                )
            )
        else:
            req.fut.set_result(None)

    def on_close(self, conn: Connection, exc: BaseException | None) -> None:
        err = TransferError(
            f"peer {conn.peer} vanished with {len(self._pending)} request(s) in flight"
            + (f": {exc}" if exc else "")
        )
        for req in self._pending.values():
            if req.landing is not None and req.replica is not None:
                req.replica.end_landing(req.chunk, req.landing)
            if not req.fut.done():
                req.fut.set_exception(err)
                req.fut.exception()  # retrieved by whoever awaits; never "never retrieved"
        self._pending.clear()
        self._wake.set()
        if self._writer is not None:
            self._writer.cancel()  # it may be waiting for an upload slot: give it back

    # -- serving -------------------------------------------------------------------------

    def _queue_reply(self, msg: GetChunk | GetManifest) -> None:
        if len(self._out) >= MAX_QUEUED_REQUESTS:
            raise ProtocolError(f"more than {MAX_QUEUED_REQUESTS} requests queued")
        try:
            replica = self.store.get(msg.key, msg.version)
        except UnknownVersion as e:
            self._out.append(_Reply(Error("unknown_version", str(e), msg.req)))
        else:
            if isinstance(msg, GetManifest):
                self._out.append(_Reply(ManifestData(msg.req, replica.manifest.root), replica))
            elif not 0 <= msg.chunk < replica.manifest.num_chunks:
                self._out.append(_Reply(Error("bad_chunk", f"no chunk {msg.chunk}", msg.req)))
            else:
                self._answer_chunk(msg, replica)
        self._wake_writer()

    def _unpark(self, msg: GetChunk) -> None:
        """A parked request's chunk arrived (or will not): answer it now, as if it had
        just come in, unless its connection is gone."""
        self._parked.discard(msg.req)
        if self.conn.is_closing or msg.req in self._cancelled:
            self._cancelled.discard(msg.req)  # (answered "cancelled" when it was given up)
            return
        try:
            self._queue_reply(msg)
        except ProtocolError as e:  # runs in another connection's callback: contain it
            self.conn.abort(e)

    def _answer_chunk(self, msg: GetChunk, replica: Replica) -> None:
        """Answer a request for a chunk of a version held here, as the serve core says."""
        peer = self.conn.peer or "?"
        seeder = replica.seeder = holder_seeder(
            replica.seeder, replica.manifest.num_chunks, self.spread_after
        )
        now = asyncio.get_running_loop().time()

        def seed() -> SeedDecision:
            assert seeder is not None
            ctx = (
                self._seed_context(peer, replica, msg.lagging) if self._seed_context else NO_CONTEXT
            )
            return seeder.decide(
                msg.chunk,
                peer,
                now,
                # A partial reader carries nothing onward: waiting for our datacenter's
                # fetchers to take the chunk across the WAN first would only delay it.
                remote=ctx.remote and msg.onward,
                local_busy=ctx.local_busy,
                alive=ctx.can_pass_on,
                behind=ctx.behind,
                spare=self._grants.policy.has_spare(),
            )

        have = bool(replica.have[msg.chunk])
        landing = None if have or not self.cut_through else replica.landing(msg.chunk)
        asked = replica.incoming.get(msg.chunk)  # whom we asked for it, if we did
        d = serve_decision(
            have=have,
            # Not if we asked the asker: each would wait on the other (two laggards that
            # took each other for the laggard ahead, both missing the same chunks).
            incoming=asked is not None and asked != peer,
            admit=lambda: self._grants.admit(peer),
            seed=seed if seeder is not None else None,
            cut_through=self.cut_through,
            landing=landing is not None,
            lagging=replica.lagging,
            asker_lagging=msg.lagging,
            # (Not once we asked anyone for it: ``incoming`` decides, the asker included.)
            starting=not have
            and asked is None
            and self.park_starting
            and replica.starting(msg.chunk),
        )
        if d.verdict is Verdict.PARK:
            self._parked.add(msg.req)
            replica.park(msg.chunk, lambda: self._unpark(msg), until_bytes=self.cut_through)
        elif d.verdict is Verdict.NO_CHUNK:
            self._out.append(_Reply(Error("no_chunk", f"chunk {msg.chunk} not held", msg.req)))
        elif d.verdict is Verdict.BUSY:
            why = "behind: relaying from the tail" if replica.lagging else "upload queue full"
            self._out.append(_Reply(Error("busy", why, msg.req)))
        elif d.verdict is Verdict.REDIRECT:
            self._out.append(_Reply(Redirect(msg.req, msg.chunk, list(d.holders))))
        else:
            if seeder is not None and msg.onward:
                seeder.sent(msg.chunk, peer, now)
            replica.begin_read()
            grant = self._grants.request(peer)
            self._out.append(
                _Reply(
                    ChunkData(msg.req, msg.chunk), replica, msg.chunk, grant, landing, msg.lagging
                )
            )

    def _cancel(self, rid: int) -> None:
        """The peer gave its request ``rid`` up: one Error "cancelled" ends it, now if its
        chunk is parked here or queued behind other replies, before the next piece if it
        is going out now. One already sent, or unknown, is left alone (the peer reads
        every reply to the end), so a stray Cancel costs a scan of the queue, nothing kept."""
        if rid in self._parked:
            self._parked.discard(rid)
            self._cancelled.add(rid)  # the chunk's landing still calls _unpark: skip it then
            self._out.append(_Reply(_cancelled(rid)))
            self._wake_writer()
            return
        for i, reply in enumerate(self._out):
            if isinstance(reply.msg, ChunkData) and reply.msg.req == rid:
                if i == 0 and self._writer is not None:  # the writer may be on it: it looks
                    self._cancelled.add(rid)
                    if reply.landing is not None:
                        reply.landing.poke()  # a stream waiting for bytes looks now
                else:
                    self._drop(reply)
                    self._unsend(reply)
                    self._out[i] = _Reply(_cancelled(rid))
                return

    def refuse_queued(self, replica: Replica) -> int:
        """``replica``'s fetch fell behind (``Replica.lag``): its chunk replies queued here
        for a peer that does not lag, not begun, are answered "busy" now, as a request for
        one would be (serve_decision), and the peer moves on to the link before us. Sent
        at our pace, they held that peer at it after our verdict: the link after a
        half-rate one, 4 chunks behind it, moved on 0.17-0.32 s after the verdict, once
        it asked for a chunk we lacked (bench/linerate.py --case slow, traced). The
        refusals go ahead of the chunk going out now (notes, between its frames): behind
        it, at our pace, they came up to 0.1 s late. How many were refused."""
        kept: deque[_Reply] = deque()
        for i, reply in enumerate(self._out):
            if (
                isinstance(reply.msg, ChunkData)
                and reply.replica is replica
                and not reply.asker_lagging
                and not (i == 0 and self._writer is not None)  # (it may be going out now)
            ):
                self._drop(reply)
                self._unsend(reply)
                self._note(Error("busy", "behind: relaying from the tail", reply.msg.req))
            else:
                kept.append(reply)
        refused = len(self._out) - len(kept)
        if refused:
            self._out.clear()  # (in place: the write loop reads self._out as it goes)
            self._out.extend(kept)
        return refused

    def _wake_writer(self) -> None:
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        self._wake.set()

    def tell_have(self, key: ShardKey, version: int, addr: str, chunk: int) -> None:
        """Tell the peer we hold ``chunk`` now (sent ahead of queued replies, coalesced)."""
        if self.conn.is_closing:
            return
        self._haves.setdefault((key, version, addr), []).append(chunk)
        self._wake_writer()

    def _tell_held(self, key: ShardKey, version: int) -> None:
        """The peer asked us for (key, version) for the first time on this connection: tell
        it every chunk of it we hold, ahead of the reply. From now on it hears of each chunk
        we gain as we gain it (``Node.announce``), but what we held before it asked reached
        it only by gossip, a round or more late, and a relay asks its upstream no further
        than the run it knows that upstream holds (``ChunkPlanner._prefix``): a link that
        moved on to the link before a laggard mid-fetch knew its new upstream's chunks up to
        one before it asked, and news of the later ones left that hole open, so it asked
        nothing for 0.3 s with its upstream 8 chunks ahead, fell behind, and judged itself
        lagging (bench/linerate.py --case slow, traced: docs/results.md, session 50). A
        complete replica is not told: the holder view lists it as full (an origin from its
        publish, a fetcher once its fetch ends), and listing every chunk of a 35k-chunk
        version to each asker costs more than the hint is worth."""
        if self._address is None or self.conn.is_closing:
            return
        try:
            replica = self.store.get(key, version)
        except UnknownVersion:
            return
        if replica.complete:
            return
        held = replica.held_chunks()
        if held:
            self._haves.setdefault((key, version, self._address()), []).extend(held)
            self._wake_writer()

    async def _write_loop(self) -> None:
        conn = self.conn
        try:
            while not conn.is_closing:
                if self._haves:  # small and time-critical: before any queued reply
                    await self._send_haves()
                    continue
                if self._notes:  # as small (a Cancel saves a chunk's bytes on the link)
                    await self._send_notes()
                    continue
                if not self._out:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                reply = self._out[0]
                if isinstance(reply.msg, ManifestData):
                    assert reply.replica is not None
                    await conn.send(reply.msg, [reply.replica.manifest.encode()])
                elif isinstance(reply.msg, ChunkData):
                    assert reply.replica is not None and reply.grant is not None
                    await reply.grant.ready  # an upload slot (fair among requesting peers)
                    r = reply.replica
                    n = r.manifest.layout.chunk_len(reply.chunk)
                    shaper = self._shaper()
                    if shaper is not None:  # WAN emulation: this node's share of the link
                        await shaper.upload(conn.peer or "?", n)
                    if reply.msg.req in self._cancelled:  # given up while it waited
                        self._cancelled.discard(reply.msg.req)
                        self._drop(reply)
                        self._unsend(reply)
                        await conn.send(_cancelled(reply.msg.req))
                        self._out.popleft()
                        continue
                    self._after_idle()
                    if reply.landing is not None and not r.have[reply.chunk]:
                        served = await self._stream(reply, n)
                    else:
                        served = await self._send_range(reply, r.data.read_parts(reply.chunk), 0, n)
                    self._chunk_sent_at = time.monotonic()
                    # Sent, not yet flushed: the flusher ends the upload and frees the slot.
                    self._unflushed.append((conn.bytes_sent, reply.replica, reply.grant))
                    if self._flusher is None:
                        self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())
                    self._cancelled.discard(reply.msg.req)  # (given up too late: it went)
                    if served:
                        self.chunks_served += 1
                        self.bytes_served += n
                        self._grants.count(conn.peer or "?", r.key, r.version, n)
                else:
                    await conn.send(reply.msg)
                self._out.popleft()
        except TransferError:
            pass  # the connection closed under us; on_close tells the other side's waiters
        finally:
            for reply in self._out:
                self._drop(reply)
            self._out.clear()

    def _after_idle(self) -> None:
        """A chunk is about to go: after ``restart_cc_after`` without one, the stream
        begins on a connection whose congestion control measured the fabric as it was
        (see ``io.tcp.restart_congestion_control``): begin it afresh."""
        after = self.restart_cc_after
        if after > 0 and time.monotonic() - self._chunk_sent_at >= after:
            self.conn.restart_congestion()

    async def _send_notes(self) -> None:
        notes, self._notes = self._notes, []
        for note in notes:
            await self.conn.send(note)

    async def _send_haves(self) -> None:
        haves, self._haves = self._haves, {}
        for (key, version, addr), chunks in haves.items():
            await self.conn.send(Have(key, version, addr, chunks))

    async def _stream(self, reply: _Reply, n: int) -> bool:
        """Send a chunk while it lands here (cut through), in pieces as its bytes arrive,
        and the last piece only once it verified here; if its landing fails instead, an
        Error for the request ends the reply (the asker drops the pieces and asks again:
        "lost_chunk" reads as "not yet"). Whether the chunk was served."""
        assert reply.landing is not None and reply.replica is not None
        landing, conn, msg, c = reply.landing, self.conn, reply.msg, reply.chunk
        assert isinstance(msg, ChunkData)
        parts = reply.replica.data.read_parts(c)
        sent = 0
        while True:
            if msg.req in self._cancelled:  # the asker gave it up: the rest stays here
                return await self._end_given_up(reply)
            if landing.failed:
                self._unsend(reply)
                await conn.send(Error("lost_chunk", f"chunk {c} did not verify here", msg.req))
                return False
            if landing.verified and self._address is not None:
                # Have before the last piece: the asker, a relay, learns we hold the chunk
                # before it holds it itself (our fetch loop would tell it a moment later),
                # so it asks its next chunks of us before its own downstream asks it.
                r = reply.replica
                self.tell_have(r.key, r.version, self._address(), c)
            if self._haves:  # (a stream may take a while: news goes out between pieces)
                await self._send_haves()
            if landing.verified:
                whole = await self._send_range(reply, parts, sent, n)
                self.chunks_cut_through += whole and sent > 0
                return whole
            ready = landing.landed - PIECE  # the tail waits for verification
            step = conn.bulk_bytes()
            if step is not None:  # (no more queued ahead of our news than the link's pace)
                ready = min(ready, sent + step)
            if ready - sent >= PIECE:
                await conn.send(ChunkData(msg.req, c, sent, False), byte_range(parts, sent, ready))
                sent = ready
                continue
            await landing.reached(sent + 2 * PIECE)

    async def _send_range(
        self, reply: _Reply, parts: Sequence[memoryview], start: int, n: int
    ) -> bool:
        """Send bytes ``start:n`` of a chunk that verified here, the last of its reply, in
        frames no larger than the connection's queue bound (``Connection.bulk_bytes``):
        news and notes waiting meanwhile go between them, not behind megabytes of chunk
        (io/send_queue.py says what that cost), and a request given up meanwhile ends
        there, the rest unsent. Whether the chunk went whole."""
        conn, msg = self.conn, reply.msg
        assert isinstance(msg, ChunkData)
        sent = start
        while True:
            step = conn.bulk_bytes()
            end = n if step is None else min(n, sent + step)
            await conn.send(
                ChunkData(msg.req, msg.chunk, sent, end == n), byte_range(parts, sent, end)
            )
            if end == n:
                return True
            sent = end
            if self._haves:
                await self._send_haves()
            if self._notes:
                await self._send_notes()
            if msg.req in self._cancelled:  # (the asker drops the pieces it got)
                return await self._end_given_up(reply)

    async def _end_given_up(self, reply: _Reply) -> bool:
        """End a chunk reply its asker gave up part-way (Cancel): the rest stays here, and
        one "cancelled" ends the request. False: the chunk did not go whole."""
        assert isinstance(reply.msg, ChunkData)
        self._cancelled.discard(reply.msg.req)
        self._unsend(reply)
        await self.conn.send(_cancelled(reply.msg.req))
        return False

    def _unsend(self, reply: _Reply) -> None:
        """A chunk reply that did not reach the peer whole (it gave the request up, or the
        chunk failed to land here): a super-seeding replica no longer counts the peer
        among the chunk's recipients. Counted, it sent later askers of the chunk to a peer
        that would not have it (an endgame copy that lost, or requests a relay link took
        back, cancelled before they went)."""
        r = reply.replica
        if r is not None and r.seeder is not None:
            r.seeder.unsent(reply.chunk, self.conn.peer or "?")

    def _drop(self, reply: _Reply) -> None:
        """A queued chunk reply that will never be sent: give back what it holds."""
        if reply.grant is not None and reply.replica is not None:
            self._grants.release(reply.grant)
            reply.replica.end_read()
            reply.grant = None

    async def _flush_loop(self) -> None:
        """End each sent upload once its bytes left our buffers (uvloop sends by reference,
        so until then the replica's memory is still read) and free its slot."""
        conn, unflushed = self.conn, self._unflushed
        try:
            while unflushed:
                mark, replica, grant = unflushed[0]
                await conn.wait_flushed(mark)
                unflushed.popleft()
                self._grants.release(grant)
                replica.end_read()
        finally:
            for _mark, replica, grant in unflushed:  # closed: nothing more leaves
                self._grants.release(grant)
                replica.end_read()
            unflushed.clear()
            self._flusher = None

    # -- fetching ------------------------------------------------------------------------

    def _new_request(self, **kw: object) -> tuple[int, _Request]:
        if self.conn.is_closing:
            raise TransferError(f"connection to {self.conn.peer} is closed")
        rid = self._next_req
        self._next_req += 1
        req = _Request(asyncio.get_running_loop().create_future(), **kw)  # type: ignore[arg-type]
        self._pending[rid] = req
        return rid, req

    async def get_manifest(
        self, key: ShardKey, version: int, expected_root: bytes | None = None
    ) -> Manifest:
        rid, req = self._new_request(expected_root=expected_root)
        await self.conn.send(GetManifest(rid, key, version))
        result = await req.fut
        assert isinstance(result, Manifest)
        return result

    async def get_chunk(
        self,
        replica: Replica,
        chunk: int,
        *,
        into: list[memoryview] | None = None,
        issued: Callable[[PeerHandler, int], None] | None = None,
        arriving: Callable[[], None] | None = None,
        onward: bool = True,
    ) -> None:
        """Fetch chunk ``chunk`` and verify it: into ``replica``'s memory, then it is held;
        or into ``into`` (scratch memory: an endgame duplicate), and the caller decides.
        ``onward`` False: the source may not count us among the chunk's recipients (a
        head check's probe, ChunkPlanner.onward), whatever the replica serves.

        ``issued(self, rid)`` is called as soon as the request exists, so a caller can
        :meth:`abandon` it synchronously (a task cancellation lands too late for that);
        ``arriving()`` when the reply's payload begins (the source is not hung)."""
        parts = replica.data.write_parts(chunk) if into is None else into
        rid, req = self._new_request(
            chunk=chunk, replica=replica, parts=parts, arriving=arriving, primary=into is None
        )
        if issued is not None:
            issued(self, rid)
        verified = False
        try:
            shaper = self._shaper()
            if shaper is not None:  # WAN emulation: the request leaves one RTT late
                await shaper.request(self.conn.peer or "?")
            msg = GetChunk(
                rid,
                replica.key,
                replica.version,
                chunk,
                replica.onward and onward,
                replica.lagging,
            )
            await self.conn.send(msg)  # (written whole once it returns: none is half sent)
            req.sent = True
            await req.fut
            verified = True
        except asyncio.CancelledError:
            self.abandon(rid)
            if not req.sent:  # the source never heard of it: no reply will end it
                self._pending.pop(rid, None)
            raise
        finally:
            if not verified and req.landing is not None:
                replica.end_landing(chunk, req.landing)  # who streams it from us stops
        if into is None:
            replica.mark(chunk, req.landing)

    def abandon(self, rid: int) -> None:
        """Give up on request ``rid`` now: from this moment its reply never writes into the
        memory it was meant for (the rest of a payload in progress goes to scratch), and
        the reply is still read and dropped, so the connection stays in sync."""
        req = self._pending.get(rid)
        if req is None or req.abandoned:
            return
        req.abandoned = True
        if req.landing is not None and req.replica is not None:
            req.replica.end_landing(req.chunk, req.landing)
        if self._receiving == rid:
            self.conn.divert_payload()
        if not req.fut.done():
            req.fut.cancel()
        if req.sent:
            self._note(Cancel(rid))  # so the source sends no more of it than it has

    def tell_behind(self, key: ShardKey, version: int, who: str = "") -> None:
        """Tell the peer, our relay upstream, that it is a slow chain head; or, with
        ``who``, tell the origin that ``who`` is one (Behind)."""
        self._note(Behind(key, version, who))

    def _note(self, msg: Message) -> None:
        """Send a small frame ahead of queued replies (none on a closing connection)."""
        if not self.conn.is_closing:
            self._notes.append(msg)
            self._wake_writer()

    async def aclose(self) -> None:
        for task in (self._writer, self._flusher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.conn.aclose()

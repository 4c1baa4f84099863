"""The TCP transport's frames and handshake over UCX (ucxx; or ucx-py's ``ucp`` where that
is what is installed): RDMA, shared memory or GPU memory where UCX finds them.

On the wire a frame is UCX *tag* messages, in order on the endpoint: one message with the
frame's prefix and header, then its payload cut at fixed offsets (every ``PIECE`` bytes of
the payload). Both ends know the cuts from the payload length, so the receiver posts each
piece straight into the destination slice the frame reader hands out, and copies through a
small bounce buffer only a piece that straddles two destination slices (a tensor boundary);
the sender likewise copies only pieces that straddle its own parts. Everything above the
messages (the HMAC handshake, limits, handlers, backpressure, errors) is
:class:`tcp.Connection`'s. (UCX's *stream* API would have matched TCP's byte stream
exactly, but under traffic in both directions a posted stream receive sometimes never
completed with ucxx 0.52; the tag API did not.)

One difference matters to callers: a TCP read lands where the reader says at the moment of
the read, while a UCX receive is posted ahead and writes its whole buffer. After
:meth:`UcxConnection.divert_payload` the piece already posted still lands in the old
memory: :meth:`UcxConnection.quiesce` waits for it (the fetcher does, before it copies a
winning duplicate over that memory or returns); a piece that does not land in time (a
stalled peer) is cancelled by closing the endpoint.

For the same reason a posted operation owns its buffer until UCX is done with it, whoever
stops waiting for it: cancelling the coroutine that awaits a UCX request does not withdraw
the request, and a receive landing in (or a send reading from) freed memory corrupts the
process (seen as segfaults in UCX's progress thread). Each operation is a task the
connection keeps with its buffer; the connection reports itself closed only after closing
the endpoint has completed (cancelled) every one of them, and a buffer whose operation UCX
never finishes is kept for the life of the process.

Callbacks from UCX's progress thread are the other hazard. ucxx 0.52 hands its C++ side a
*borrowed* pointer to the dict holding a Python callback (``set_close_callback``, the
listener's accept callback); the dict dies with its Python owner, and a callback already
waiting for the GIL in the progress thread then reads freed memory (seen as ``KeyError:
'cb_func'`` and as a segfault in a later garbage collection). So endpoints get no close
callback here: a watcher polls ``alive`` instead (``ALIVE_POLL``). A closed listener's
binding object is kept for ``LISTENER_GRACE`` seconds, long enough for a callback that
was already under way to run against live memory, and a connection it still delivers is
closed at once.

Enable with the ``tensorhub[ucx]`` extra. ``UCX_TLS``/``UCX_NET_DEVICES`` choose UCX's
transports as usual (tests use ``tcp,self`` on ``lo``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..core.auth import TAGS_SIZE
from ..core.errors import AuthenticationError, ProtocolError, TransferError
from ..core.messages import Error, Message
from ..core.wire import PREFIX, Limits, encode_frame, encode_header, head_size
from ..typing import Buffer
from .tcp import DEFAULT_LIMITS, HANDSHAKE_TIMEOUT, HIGH_WATER, Connection, Handler, parse_address

log = logging.getLogger(__name__)

PIECE = 4 << 20
"""Largest single receive posted into a payload (bounds what lands after a divert)."""
QUIESCE_TIMEOUT = 2.0
"""Seconds a posted piece may take to land after a divert before the connection is dropped."""

CLOSE_DRAIN_TIMEOUT = 5.0
"""Seconds to wait, after closing an endpoint, for UCX to finish its posted operations."""

ALIVE_POLL = 0.05
"""Seconds between checks that an endpoint is still alive (UCX fails a peer's death on
the endpoint but not on a receive posted to it)."""

LISTENER_GRACE = 5.0
"""Seconds a closed listener's binding object is kept (see the module docstring)."""

_BACKENDS = ("ucxx", "ucp")
_RETIRED: deque[tuple[float, object]] = deque()
"""Closed listeners' binding objects, with when they were closed."""
_ORPHANS: list[tuple[asyncio.Future[Any], object]] = []
"""Operations UCX never finished, with their buffers: kept so their memory is never reused."""
_state: dict[str, Any] = {}


def backend() -> ModuleType | None:
    """The UCX binding this process can use (ucxx first, then ucx-py), or None."""
    if "mod" not in _state:
        _state["mod"] = None
        for name in _BACKENDS:
            try:
                _state["mod"] = importlib.import_module(name)
                break
            except ImportError:
                continue
    mod: ModuleType | None = _state["mod"]
    return mod


def available() -> bool:
    return backend() is not None


def worthwhile() -> bool:
    """Whether this host has something UCX is faster on than our TCP path: an RDMA device.

    A GPU alone is not enough. Chunks travel in host memory (see :mod:`.device`), and on
    an H100 host without RDMA, UCX's own choice of transports moved 1 GiB between two
    local processes at 0.27x a raw socket's rate, where our TCP transport ran at
    0.88-0.96x (``UCX_TLS=sm,self,cuda_copy``: 0.87x; bench/p2p.py, 2026-11-22)."""
    rdma = Path("/sys/class/infiniband")
    return rdma.is_dir() and any(rdma.iterdir())


def loopback_defaults() -> None:
    """Point UCX at loopback TCP where nothing says otherwise: for tests and benchmarks on
    one machine without RDMA (UCX would otherwise also try the host's Ethernet device)."""
    if "UCX_TLS" not in os.environ and not worthwhile():
        os.environ["UCX_TLS"] = "tcp,self"
        os.environ.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")


def _ucx() -> ModuleType:
    mod = backend()
    if mod is None:
        raise RuntimeError(
            "the UCX transport needs ucxx (pip install 'tensorhub[ucx]') or ucx-py (ucp)"
        )
    if not _state.get("init"):
        # Thread progress: the only mode that needs nothing from the event loop, so it
        # works under uvloop and asyncio alike.
        mod.init(progress_mode="thread") if mod.__name__ == "ucxx" else mod.init()
        _state["init"] = True
    return mod


def pieces(parts: Sequence[Buffer], piece: int = 0) -> Iterator[Buffer]:
    """A payload cut every ``piece`` (``PIECE``) bytes, as the receiver expects: slices
    of the parts, joined (copied) only where a piece straddles two of them."""
    size = piece or PIECE
    views = [memoryview(p).cast("B") for p in parts]
    i, off = 0, 0
    while i < len(views):
        if len(views[i]) - off >= size or i == len(views) - 1:
            n = min(size, len(views[i]) - off)
            yield views[i][off : off + n]
            off += n
        else:
            out, need = bytearray(), size
            while need and i < len(views):
                take = views[i][off : off + need]
                out += take
                need -= len(take)
                off += len(take)
                if off == len(views[i]):
                    i, off = i + 1, 0
            yield out
            continue
        if off == len(views[i]):
            i, off = i + 1, 0


class UcxConnection(Connection):
    """One authenticated UCX endpoint carrying tensorhub frames."""

    def __init__(self, ep: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._ep = ep
        self._queue: deque[tuple[bytes, Sequence[Buffer]]] = deque()
        self._queued = asyncio.Event()
        self._unsent = 0  # bytes queued and not yet taken by UCX
        self._closing = False
        self._posted: dict[asyncio.Future[Any], tuple[bool, object]] = {}  # op: (recv?, buffer)
        self._tasks: list[asyncio.Task[None]] = []
        self._closer: asyncio.Future[None] | None = None
        self._reading = asyncio.Event()
        self._reading.set()
        self._bounce = bytearray(PIECE)

    def start(self) -> None:
        loop = self._loop

        def closed_by_ucx() -> None:  # from UCX's progress thread
            with contextlib.suppress(RuntimeError):  # the loop may be gone at exit
                loop.call_soon_threadsafe(self._endpoint_closed)

        self._tasks = [
            asyncio.ensure_future(self._read_loop()),
            asyncio.ensure_future(self._write_loop()),
        ]
        # A receive posted on an endpoint whose peer died is not failed by UCX; this is.
        if hasattr(self._ep, "alive"):  # ucxx: poll (its close callback is unsafe, above)
            self._tasks.append(asyncio.ensure_future(self._watch_alive()))
        elif hasattr(self._ep, "set_close_callback"):  # ucx-py keeps its callback alive
            self._ep.set_close_callback(closed_by_ucx)
        self._begin_handshake("", "")  # UCX offers no socket address to bind

    def _endpoint_closed(self) -> None:
        """UCX closed the endpoint (the peer went away): as TCP's EOF at a frame boundary,
        an error mid-frame."""
        if not self._closing:
            if not self._reader.at_frame_boundary:
                self.error = self.error or TransferError(
                    f"UCX endpoint to {self.peer or '?'} closed mid-frame"
                )
            self._lost()

    async def _watch_alive(self) -> None:
        while True:
            await asyncio.sleep(ALIVE_POLL)
            if self._closing:
                return
            if not self._ep.alive:
                self._endpoint_closed()
                return

    # -- receiving -----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        reader = self._reader
        try:
            while not self._closing:
                await self._reading.wait()
                head = reader.get_buffer()
                room = PREFIX.size + reader.limits.max_header + TAGS_SIZE
                if len(head) < room:
                    raise ProtocolError("frame reader has no room for a header")
                # A message longer than the room fails the receive (UCX truncates): a peer
                # cannot make us take an oversized header.
                head[: PREFIX.size] = bytes(PREFIX.size)  # a short message: bad magic
                await self._recv(head[:room])
                self.buffer_updated(min(head_size(head), room))
                while reader.receiving_payload:
                    await self._recv_piece()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the peer went away, or UCX failed the endpoint
            if not reader.at_frame_boundary:
                self.error = self.error or TransferError(
                    f"peer {self.peer or '?'} closed the connection mid-frame: {e}"
                )
            self._lost()

    async def _recv_piece(self) -> None:
        """The next ``PIECE`` of the payload: into the destination if it fits the slice
        the reader offers, else through the bounce buffer."""
        reader = self._reader
        n = min(PIECE, reader.payload_left)
        dest = reader.get_buffer()
        direct = len(dest) >= n
        await self._recv(dest[:n] if direct else memoryview(self._bounce)[:n])
        if direct:
            self.buffer_updated(n)
            return
        done = 0
        while done < n:
            dest = reader.get_buffer()
            k = min(len(dest), n - done)
            dest[:k] = self._bounce[done : done + k]
            done += k
            self.buffer_updated(k)

    # -- posted operations -------------------------------------------------------------------

    def _post(self, op: Coroutine[Any, Any, Any], buf: object, recv: bool) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(op)
        self._posted[task] = (recv, buf)

        def done(t: asyncio.Future[Any]) -> None:
            self._posted.pop(t, None)
            if not t.cancelled():
                t.exception()  # retrieved: the awaiter, if any is left, sees it too

        task.add_done_callback(done)
        return task

    async def _recv(self, buf: Buffer) -> None:
        # shield: a cancelled caller leaves the receive (and its buffer) to the connection
        await asyncio.shield(self._post(self._ep.recv(buf), buf, recv=True))

    async def _send(self, buf: Buffer) -> None:
        await asyncio.shield(self._post(self._ep.send(buf), buf, recv=False))

    async def quiesce(self) -> None:
        """Wait until no receive posted before now can still write its memory; a piece that
        does not land within ``QUIESCE_TIMEOUT`` (a stalled peer) costs the connection."""
        pending = [t for t, (recv, _b) in self._posted.items() if recv]
        if not pending:
            return
        _done, late = await asyncio.wait(pending, timeout=QUIESCE_TIMEOUT)
        if late:
            self.error = self.error or TransferError(
                f"a receive from {self.peer or '?'} did not land in {QUIESCE_TIMEOUT}s"
            )
            self._lost()
            await asyncio.shield(self.closed)

    # -- sending -------------------------------------------------------------------------------

    def _write(self, msg: Message, payload: Sequence[Buffer] = ()) -> None:
        if self._closing:
            raise TransferError(f"connection to {self.peer or '?'} is closed")
        header, payload = encode_frame(msg, payload, self._sealer)
        n = sum(len(p) for p in payload)
        self._queue.append((header, [p for p in payload if len(p)]))
        self._queued.set()
        self.bytes_sent += len(header) + n
        self._unsent += len(header) + n
        if self._unsent > HIGH_WATER:
            self._can_write.clear()

    async def _write_loop(self) -> None:
        try:
            while True:
                if not self._queue:
                    self._queued.clear()
                    await self._queued.wait()
                    continue
                header, payload = self._queue.popleft()
                await self._send(header)
                self._unsent -= len(header)
                for piece in pieces(payload):
                    await self._send(piece)
                    self._unsent -= len(piece)
                    if self._unsent <= HIGH_WATER:
                        self._can_write.set()
                if self._unsent <= HIGH_WATER:
                    self._can_write.set()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.error = self.error or TransferError(f"send to {self.peer or '?'} failed: {e}")
            self._lost()

    @property
    def unsent(self) -> int:
        return self._unsent

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def kill(self) -> None:
        self._lost()

    @property
    def is_closing(self) -> bool:
        return self._closing

    # -- closing -------------------------------------------------------------------------------

    def _lost(self) -> None:
        if self._closing:
            return
        self._closing = True
        current = asyncio.current_task()
        for t in self._tasks:
            if t is not current:
                t.cancel()

        async def close_then_report() -> None:
            # Closing cancels the endpoint's posted operations. (A synchronous abort from
            # the event loop's thread crashed ucxx 0.52 while its progress thread ran.)
            with contextlib.suppress(Exception):
                await self._ep.close(period=10**9)
            posted = dict(self._posted)
            if posted:
                await asyncio.wait(posted, timeout=CLOSE_DRAIN_TIMEOUT)
                late = [(t, b) for t, (_r, b) in posted.items() if not t.done()]
                if late:
                    log.warning(
                        "UCX left %d operations to %s unfinished after closing; "
                        "keeping their buffers",
                        len(late),
                        self.peer or "?",
                    )
                    _ORPHANS.extend(late)
            self.connection_lost(None)  # why, if anything, is in self.error

        self._closer = asyncio.ensure_future(close_then_report())

    def abort(self, exc: BaseException) -> None:
        log.warning("dropping connection %s<->%s: %s", self.node, self.peer or "?", exc)
        self.error = exc
        if self._closing:
            return
        code = "auth" if isinstance(exc, AuthenticationError) else "protocol"

        async def tell_and_close() -> None:  # best effort: the peer may be gone
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._send(encode_header(Error(code, str(exc)[:512]), 0, self._sealer)), 1.0
                )
            self._lost()

        self._tasks.append(asyncio.ensure_future(tell_and_close()))

    def close(self) -> None:
        if not self._closing:

            async def flush_and_close() -> None:
                with contextlib.suppress(Exception):  # what was sent goes out first
                    await asyncio.wait_for(self.wait_flushed(self.bytes_sent), 5.0)
                self._lost()

            self._tasks.append(asyncio.ensure_future(flush_and_close()))


class UcxServer:
    """A UCX listener that turns each incoming endpoint into a :class:`UcxConnection`."""

    def __init__(self, listener: Any, host: str, conns: set[Connection]) -> None:
        self._listener = listener
        self.connections = conns
        self.address = f"{host}:{listener.port}"
        self.closed = False

    async def close(self) -> None:
        self.closed = True  # an endpoint UCX still delivers is turned away (listen's accept)
        for c in list(self.connections):
            c.close()
        await asyncio.gather(*(c.closed for c in list(self.connections)))
        _retire(getattr(self._listener, "_listener", None))
        self._listener.close()


def _retire(binding: object, now: float | None = None) -> None:
    """Keep a closed listener's binding object ``LISTENER_GRACE`` seconds (the module
    docstring says why), letting go of those kept longer."""
    now = time.monotonic() if now is None else now
    while _RETIRED and now - _RETIRED[0][0] > LISTENER_GRACE:
        _RETIRED.popleft()
    if binding is not None:
        _RETIRED.append((now, binding))


async def listen(
    addr: str,
    *,
    node: str,
    secret: bytes,
    handler_factory: Callable[[Connection], Handler],
    limits: Limits = DEFAULT_LIMITS,
) -> UcxServer:
    """Listen for UCX endpoints on ``addr``'s port (0: a free one; see ``address``)."""
    ucx = _ucx()
    host, port = parse_address(addr)
    conns: set[Connection] = set()
    server: UcxServer | None = None

    async def accept(ep: Any) -> None:
        if server is None or server.closed:  # delivered after close (or before we are set up)
            with contextlib.suppress(Exception):
                await ep.close(period=10**9)
            return
        conn = UcxConnection(
            ep,
            node=node,
            secret=secret,
            client=False,
            handler_factory=handler_factory,
            limits=limits,
        )
        conns.add(conn)
        conn.closed.add_done_callback(lambda _f: conns.discard(conn))
        conn.start()
        await conn.closed  # the binding keeps the endpoint while its handler runs

    _retire(None)  # let go of listeners closed long enough ago
    listener = ucx.create_listener(accept, port=port)
    server = UcxServer(listener, host if host != "0.0.0.0" else "127.0.0.1", conns)
    return server


async def connect(
    addr: str,
    *,
    node: str,
    secret: bytes,
    handler_factory: Callable[[Connection], Handler],
    limits: Limits = DEFAULT_LIMITS,
    timeout: float = HANDSHAKE_TIMEOUT,
) -> UcxConnection:
    """Open a UCX endpoint to ``addr`` and complete the handshake."""
    ucx = _ucx()
    host, port = parse_address(addr)
    try:
        ep = await asyncio.wait_for(ucx.create_endpoint(host, port), timeout)
    except Exception as e:
        raise TransferError(f"cannot connect to ucx://{addr}: {e}") from e
    conn = UcxConnection(
        ep, node=node, secret=secret, client=True, handler_factory=handler_factory, limits=limits
    )
    conn.start()
    try:
        await asyncio.wait_for(asyncio.shield(conn.ready), timeout)
    except asyncio.TimeoutError:
        conn._lost()
        raise TransferError(f"handshake with ucx://{addr} timed out after {timeout}s") from None
    except BaseException:  # refused, or the dial was cancelled (the node is closing)
        conn._lost()
        raise
    return conn

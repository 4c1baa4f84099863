"""The TCP transport's frames and handshake over UCX (ucxx; or ucx-py's ``ucp`` where that
is what is installed): RDMA, shared memory or GPU memory where UCX finds them.

Why the UCX *stream* API: a frame is a prefix, a header and a payload that the receiver
scatters into destination slices whose boundaries need not match the sender's parts. A UCX
stream, like a TCP socket, carries bytes without message boundaries, so the receiver asks
for exactly what the :class:`~tensorhub.core.wire.FrameReader` needs next
(:meth:`~tensorhub.core.wire.FrameReader.wanted`): the prefix, the header, then each
destination slice in place — no staging copy. Everything above the byte stream (the HMAC
handshake, limits, handlers, backpressure, errors) is :class:`tcp.Connection`'s.

One difference matters to callers: a TCP read lands where the reader says at the moment of
the read, while a UCX receive is posted ahead and writes its whole buffer. So receives into
a payload are posted in pieces of at most ``PIECE`` bytes, and after
:meth:`UcxConnection.divert_payload` the piece already posted still lands in the old
memory: :meth:`UcxConnection.quiesce` waits for it (the fetcher does, before it copies a
winning duplicate over that memory or returns).

Enable with the ``tensorhub[ucx]`` extra. ``UCX_TLS``/``UCX_NET_DEVICES`` choose UCX's
transports as usual (tests use ``tcp,self`` on ``lo``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..core.errors import TransferError
from ..core.messages import Error, Message
from ..core.wire import encode_header
from ..typing import Buffer
from .tcp import DEFAULT_LIMITS, HANDSHAKE_TIMEOUT, HIGH_WATER, Connection, Handler, parse_address

log = logging.getLogger(__name__)

PIECE = 4 << 20
"""Largest single receive posted into a payload (bounds what lands after a divert)."""

_BACKENDS = ("ucxx", "ucp")
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
    """Whether this host has something UCX is faster on than our TCP path: an RDMA
    device or a GPU. (UCX over plain TCP measured about half our sockets' rate here.)"""
    rdma = Path("/sys/class/infiniband")
    if rdma.is_dir() and any(rdma.iterdir()):
        return True
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


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


class _Stream:
    """Stream send/receive on one endpoint of either binding. ucxx exposes them on its
    low-level endpoint; ucx-py through ``ucp.comm`` (the calls its own handshake uses)."""

    def __init__(self, ep: Any) -> None:
        mod = backend()
        assert mod is not None
        self.ep = ep
        self._send: Callable[[Any], Awaitable[Any]]
        self._recv: Callable[[Any], Awaitable[Any]]
        if mod.__name__ == "ucxx":
            from ucxx._lib.arr import Array

            low = ep._ep
            self._send = lambda b: low.stream_send(Array(b)).wait()
            self._recv = lambda b: low.stream_recv(Array(b)).wait()
        else:  # ucx-py
            from ucp import comm
            from ucp._libs.arr import Array as UcpArray

            self._send = lambda b: comm.stream_send(ep._ep, UcpArray(b), len(b))
            self._recv = lambda b: comm.stream_recv(ep._ep, UcpArray(b), len(b))

    async def send(self, buf: Buffer) -> None:
        await self._send(buf)

    async def recv(self, buf: memoryview) -> None:
        await self._recv(buf)

    def abort(self) -> None:
        self.ep.abort()


class UcxConnection(Connection):
    """One authenticated UCX endpoint carrying tensorhub frames."""

    def __init__(self, ep: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._stream = _Stream(ep)
        self._queue: deque[list[Buffer]] = deque()
        self._queued = asyncio.Event()
        self._unsent = 0  # bytes queued and not yet taken by UCX
        self._closing = False
        self._landing: asyncio.Future[None] | None = None  # a receive posted into a sink
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.ensure_future(self._read_loop()),
            asyncio.ensure_future(self._write_loop()),
        ]
        if self._client_hs is not None:
            self._write(self._client_hs.hello())

    # -- receiving -----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        reader = self._reader
        try:
            while not self._closing:
                buf = reader.get_buffer()
                n = min(len(buf), reader.wanted(), PIECE)
                landing = self._loop.create_future() if reader.in_sink else None
                self._landing = landing
                try:
                    await self._stream.recv(buf[:n])
                finally:
                    if landing is not None:
                        landing.set_result(None)
                        self._landing = None
                self.buffer_updated(n)  # the frame logic, errors and handlers of TCP's
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the peer went away, or UCX failed the endpoint
            if not reader.at_frame_boundary:
                self.error = self.error or TransferError(
                    f"peer {self.peer or '?'} closed the connection mid-frame: {e}"
                )
            self._lost(None)

    async def quiesce(self) -> None:
        """Wait until no receive posted before a divert can still write its memory."""
        landing = self._landing
        if landing is not None:
            await asyncio.shield(landing)

    # -- sending -------------------------------------------------------------------------------

    def _write(self, msg: Message, payload: Sequence[Buffer] = ()) -> None:
        if self._closing:
            raise TransferError(f"connection to {self.peer or '?'} is closed")
        n = sum(len(p) for p in payload)
        header = encode_header(msg, n)
        self._queue.append([header, *(p for p in payload if len(p))])
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
                # A stream keeps order: post the frame's pieces at once, then wait for all
                # (one round trip through the progress thread per frame, not per piece).
                bufs = self._queue.popleft()
                await asyncio.gather(*(self._stream.send(b) for b in bufs))
                self._unsent -= sum(len(b) for b in bufs)
                if self._unsent <= HIGH_WATER:
                    self._can_write.set()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.error = self.error or TransferError(f"send to {self.peer or '?'} failed: {e}")
            self._lost(None)

    @property
    def flushed(self) -> int:
        return self.bytes_sent - self._unsent

    @property
    def is_closing(self) -> bool:
        return self._closing

    # -- closing -------------------------------------------------------------------------------

    def _lost(self, exc: Exception | None) -> None:
        if self._closing:
            return
        self._closing = True
        current = asyncio.current_task()
        for t in self._tasks:
            if t is not current:
                t.cancel()
        with contextlib.suppress(Exception):
            self._stream.abort()
        self.connection_lost(exc)

    def abort(self, exc: BaseException) -> None:
        log.warning("dropping connection %s<->%s: %s", self.node, self.peer or "?", exc)
        self.error = exc
        if self._closing:
            return
        code = "auth" if "Authentication" in type(exc).__name__ else "protocol"
        stream = self._stream

        async def tell_and_close() -> None:  # best effort: the peer may be gone
            with contextlib.suppress(Exception):
                frame = encode_header(Error(code, str(exc)[:512]))
                await asyncio.wait_for(stream.send(frame), 1.0)
            self._lost(None)

        self._tasks.append(asyncio.ensure_future(tell_and_close()))

    def close(self) -> None:
        if not self._closing:

            async def flush_and_close() -> None:
                with contextlib.suppress(Exception):  # what was sent goes out first
                    await asyncio.wait_for(self.wait_flushed(self.bytes_sent), 5.0)
                self._lost(None)

            self._tasks.append(asyncio.ensure_future(flush_and_close()))

    async def wait_flushed(self, mark: int, poll: float = 0.001) -> None:
        while not self._closing and self.flushed < mark:  # noqa: ASYNC110
            await asyncio.sleep(poll)


class UcxServer:
    """A UCX listener that turns each incoming endpoint into a :class:`UcxConnection`."""

    def __init__(self, listener: Any, host: str, conns: set[Connection]) -> None:
        self._listener = listener
        self.connections = conns
        self.address = f"{host}:{listener.port}"

    async def close(self) -> None:
        for c in list(self.connections):
            c.close()
        await asyncio.gather(*(c.closed for c in list(self.connections)))
        self._listener.close()


async def listen(
    addr: str,
    *,
    node: str,
    secret: bytes,
    handler_factory: Callable[[Connection], Handler],
    limits: Any = DEFAULT_LIMITS,
) -> UcxServer:
    """Listen for UCX endpoints on ``addr``'s port (0: a free one; see ``address``)."""
    ucx = _ucx()
    host, port = parse_address(addr)
    conns: set[Connection] = set()

    async def accept(ep: Any) -> None:
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

    listener = ucx.create_listener(accept, port=port)
    return UcxServer(listener, host if host != "0.0.0.0" else "127.0.0.1", conns)


async def connect(
    addr: str,
    *,
    node: str,
    secret: bytes,
    handler_factory: Callable[[Connection], Handler],
    limits: Any = DEFAULT_LIMITS,
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
        conn._lost(None)
        raise TransferError(f"handshake with ucx://{addr} timed out after {timeout}s") from None
    return conn

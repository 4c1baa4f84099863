"""Authenticated, framed TCP connections with zero-copy receive and send.

Receive: :class:`Connection` is an ``asyncio.BufferedProtocol``. The event loop asks it for
a buffer before every ``recv_into``; it returns the slice of memory the frame reader wants
filled next — while a chunk payload is arriving, that is a slice of the destination tensor
itself. Send: headers are small ``bytes``; payloads are written as memoryviews of tensor
memory, and :meth:`Connection.send` waits while the transport's buffer is above its high
water mark (backpressure), so a fast sender cannot grow memory without bound.

Every connection runs the mutual HMAC handshake of :mod:`tensorhub.core.auth` first, bound
to the socket addresses both ends see; every frame after it carries a MAC under that
session's keys. Until it completes, the reader accepts only tiny headers and no payloads,
nothing reaches the handler, and the accepting side gives it ``HANDSHAKE_TIMEOUT`` seconds;
at most ``MAX_UNAUTHENTICATED`` connections may be handshaking at once per listener (the
oldest is dropped for a newer one: a flood of idle sockets cannot lock real peers out, and
a real peer's handshake takes one round trip). A protocol or authentication error closes
that one connection, counted and logged; the node keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from ..core.auth import (
    ClientHandshake,
    FrameOpener,
    FrameSealer,
    ServerHandshake,
    SessionKeys,
)
from ..core.errors import AuthenticationError, ProtocolError, TransferError
from ..core.messages import Auth, Challenge, Error, Hello, Message, Packed, Welcome
from ..core.wire import (
    PROTO_VERSION,
    Frame,
    FrameReader,
    Limits,
    Payload,
    encode_frame,
    encode_header,
    unpack,
)
from ..typing import Buffer
from .recv_window import receive_window, wake_mark, window_needed
from .send_queue import MIN_QUEUE, DrainRate, delivery_rate, limit_unsent, queue_bytes
from .sockopts import SocketLike, SocketOptions

log = logging.getLogger(__name__)

DEFAULT_LIMITS = Limits()
CLOSE_GRACE = 2.0
"""Seconds a closing connection may spend sending what it buffered (a reply's last bytes,
an error for the peer) before it is aborted. A graceful close ends only once the peer
has read them: one that reads nothing (hung, stopped, or overwhelmed) made ``Node.close``
wait for good (tests/test_transport.py::test_a_node_closes_though_a_peer_reads_nothing)."""

CONGESTION_ENV = "TENSORHUB_TCP_CONGESTION"
"""An environment variable naming the TCP congestion control every connection of this
process uses (``cubic``, ``bbr``, ``reno``: one of
``/proc/sys/net/ipv4/tcp_available_congestion_control``); unset, the host's default. An
operator's choice, as NCCL's socket settings are: on bench/linerate.py's fabric (each node
behind a 1 Gbit/s ``tbf``), a relay link's acknowledgements wait behind its own upstream
data in its NIC's queue, and under BBR (this host's default) the first link of the chain
moved 0.91 of line rate where a lone copy moves 0.99; under cubic it finished within
1.02-1.06x of one copy, under BBR 1.07-1.10x (docs/results.md, session 25). A name the
kernel refuses (or a system without ``TCP_CONGESTION``) is logged once and the host's
default stays."""
_congestion_refused: set[str] = set()


def use_congestion_control(sock: socket.socket) -> None:
    """Set :data:`CONGESTION_ENV`'s algorithm on ``sock``, if one is named."""
    name = os.environ.get(CONGESTION_ENV)
    if not name:
        return
    try:
        option = getattr(socket, "TCP_CONGESTION", None)  # (Linux only)
        if option is None:
            raise OSError("TCP_CONGESTION is not supported on this system")
        sock.setsockopt(socket.IPPROTO_TCP, option, name.encode())
    except OSError as e:
        if name not in _congestion_refused:
            _congestion_refused.add(name)
            log.warning("%s=%s refused (%s): the host's default stays", CONGESTION_ENV, name, e)


def restart_congestion_control(sock: SocketLike) -> bool:
    """Begin ``sock``'s congestion control afresh, as on a new connection, keeping its
    algorithm: the kernel re-initialises an algorithm's state when the socket moves to
    another, so it is set to another and back. Whether it was (Linux, ``TCP_CONGESTION``).

    Why: a connection opened while the fabric was idle keeps the round trip it measured
    then. Cubic's HyStart ends slow start once a round trip grows a few milliseconds past
    that least one, so when chunks first flow on it once the NICs' queues are full, it
    leaves slow start at once and grows its window linearly (bench/linerate.py --case
    slow, ``ss -ti`` every 30 ms: the link after the slow one, moving to the link before
    it, got a window of 25-31 packets at a 6.5-12.7 ms round trip, where the window it
    needs took 0.3-0.5 s to reach; --case killed, session 30: 0.45 s). Begun afresh it
    measures the round trip as it is now and grows as a new connection would."""
    option = getattr(socket, "TCP_CONGESTION", None)  # (Linux only)
    if option is None:
        return False
    try:
        name = sock.getsockopt(socket.IPPROTO_TCP, option, 16).split(b"\0", 1)[0]
        other = b"cubic" if name == b"reno" else b"reno"  # (both always allowed)
        sock.setsockopt(socket.IPPROTO_TCP, option, other)
        sock.setsockopt(socket.IPPROTO_TCP, option, name)
    except OSError:
        return False  # (closing under us, or an algorithm this process may not set)
    return True


HIGH_WATER = 4 << 20
"""Bytes buffered in a transport before :meth:`Connection.send` waits for them to drain,
where the link's pace cannot be measured (no ``tcp_info``; UCX's own queue). A TCP
connection that can measure it bounds its queue by that pace instead
(:meth:`Connection.bulk_bytes`; io/send_queue.py)."""
RATE_EVERY = 0.001
"""Seconds between two reads of a connection's delivery rate (a system call each)."""
HANDSHAKE_TIMEOUT = 10.0
"""Seconds a handshake may take, dialling or accepting."""
MAX_UNAUTHENTICATED = 128
"""Connections a listener lets handshake at once (about 64 KiB each)."""
RECV_LOW_WATER = 256 << 10
"""While a payload arrives, the kernel wakes us once this much of it can be read (or all
that is left of it; ``SO_RCVLOWAT``). A 1 Gbit/s link otherwise woke the event loop for
every ~60 KB, and each wakeup runs the frame reader in Python: 2,000 a second per
receiving connection. Until session 34 the rest of a payload under this much was read
as it came (a mark of 1 byte): a relay's chunk pieces are a few hundred KiB, and a
relay's reads were three quarters such tails of 32-64 KiB (bench/linerate.py, N=3). Never
more than half the receive window (io/recv_window.py says why)."""
FLUSH_POLL = (0.001, 0.008)
"""Least and most seconds :meth:`Connection.wait_flushed` waits between looks. The most is
well under what the kernel's send buffer holds at 1 Gbit/s (megabytes: tens of ms), so a
slot freed a little late still finds the wire busy."""


def flush_poll(left: int, last: tuple[float, int], now: float, flushed: int) -> float:
    """How long to wait before looking again whether ``left`` more bytes left our buffers:
    three quarters of the time they take at the pace seen since the ``last`` look
    ((time, flushed) then), within :data:`FLUSH_POLL`; the least with no pace seen yet."""
    least, most = FLUSH_POLL
    dt, moved = now - last[0], flushed - last[1]
    if dt <= 0 or moved <= 0 or dt > 1.0:  # (no pace yet, or from an earlier send)
        return least
    return min(most, max(least, 0.75 * left * dt / moved))


class Handler(Protocol):
    """What a connection delivers authenticated frames to."""

    def on_frame(
        self, conn: Connection, msg: Message, payload_len: int
    ) -> Sequence[memoryview] | None:
        """A header arrived. For a payload frame, return where its bytes go (or None: the
        connection allocates a buffer). Raising ProtocolError closes the connection."""

    def on_payload(self, conn: Connection, msg: Message, parts: Sequence[memoryview]) -> None:
        """The payload of ``msg`` is complete in ``parts``."""

    def on_close(self, conn: Connection, exc: BaseException | None) -> None:
        """The connection closed (``exc`` says why, None for a clean close)."""

    def on_progress(self, conn: Connection, landed: int) -> None:
        """``landed`` bytes of the payload in progress are in the memory on_frame gave
        (told after each read that put some there)."""


LOW_PORT = 20000
"""The lowest port :func:`free_ports` picks: below it lie the well-known and registered
services."""


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` ports free on ``host`` now, for a local cluster whose addresses must be known
    before it starts (the voter set). Another process could take one in between; drawn at
    random below the kernel's ephemeral range, so that neither an outgoing connection's
    port nor another cluster's pick is likely to be one. Ports the kernel hands out
    (bind to 0) came back to two local clusters started a moment apart (two test workers):
    each took the other's voter for its own, and one voter could not bind (CI, session 37)."""
    low, high = _ephemeral_range()
    if high - low < 4 * n:  # (no room below the ephemeral range: the kernel's pick)
        return _kernel_ports(n, host)
    rng = random.SystemRandom()
    out: list[int] = []
    for _ in range(64 * n):
        port = rng.randrange(low, high)
        if port in out:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        out.append(port)
        if len(out) == n:
            return out
    return out + _kernel_ports(n - len(out), host)


def _ephemeral_range() -> tuple[int, int]:
    """Ports from ``LOW_PORT`` to the first the kernel gives outgoing connections (Linux's
    ``ip_local_port_range``); an empty range where that is not known."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            first = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return LOW_PORT, LOW_PORT
    return LOW_PORT, max(LOW_PORT, first)


def _kernel_ports(n: int, host: str) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def local_addresses(names: Sequence[str], host: str = "127.0.0.1") -> dict[str, str]:
    """A free "host:port" for each of ``names`` (the voters of a local cluster, whose
    addresses are its seeds)."""
    return {n: f"{host}:{p}" for n, p in zip(names, free_ports(len(names), host), strict=True)}


def parse_address(addr: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) → (host, port), with a clear error."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {addr!r} is not host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


class Connection(asyncio.BufferedProtocol):
    """One authenticated TCP connection carrying tensorhub frames."""

    def __init__(
        self,
        *,
        node: str,
        secret: bytes,
        client: bool,
        handler_factory: Callable[[Connection], Handler],
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.node = node
        self.peer: str | None = None
        self.client = client
        self._limits = limits
        self._reader = FrameReader()
        self._handler_factory = handler_factory
        self._handler: Handler | None = None
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = self._loop.create_future()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.error: BaseException | None = None
        self.taken = False  # (a dialled one: its caller has it; see connect)
        self.bytes_sent = 0
        self.bytes_received = 0
        self._secret = secret
        self._sealer: FrameSealer | None = None
        self._client_hs: ClientHandshake | None = None
        self._server_hs: ServerHandshake | None = None
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._drained = (0.0, 0)  # (loop time, flushed) at wait_flushed's last look
        self._sock: SocketOptions | None = None  # (its options: see io/sockopts.py)
        self._low_water = 1  # the socket's SO_RCVLOWAT now
        self._window = 0  # the receive window when last read (recv_window.receive_window)
        self._drain = DrainRate()  # the link's pace, for the queue's bound (bulk_bytes)
        self._queue_bound: int | None = None  # that bound now; None: unbounded (HIGH_WATER)
        self._rate_at = 0.0  # loop time of the last delivery-rate read
        self.congestion_restarts = 0  # (restart_congestion: for a test or a log)
        self._close_asked = False
        """close() came before the transport (see :meth:`connection_made`)."""

    def _begin_handshake(self, target: str, local: str) -> None:
        """The transport is connected: start the handshake (the client says Hello; the
        accepting side gives it ``HANDSHAKE_TIMEOUT``). ``target``/``local`` are the
        addresses it binds (see :mod:`tensorhub.core.auth`), "" where the transport
        cannot say."""
        nonce = os.urandom(32)
        if self.client:
            self._client_hs = ClientHandshake(self._secret, self.node, nonce, PROTO_VERSION, target)
            self._write(self._client_hs.hello())
        else:
            self._server_hs = ServerHandshake(self._secret, self.node, nonce, PROTO_VERSION, local)
            self._handshake_timer = self._loop.call_later(HANDSHAKE_TIMEOUT, self._expire_handshake)

    def _expire_handshake(self) -> None:
        if not self.ready.done():
            self.abort(AuthenticationError(f"no handshake within {HANDSHAKE_TIMEOUT}s"))

    # -- asyncio protocol callbacks ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        if self._close_asked:
            # Closed between the accept and now (a server closing while a connection it
            # accepted was being set up): it was open for good, and the server's close
            # waited for it (tests/test_session_parity.py hung 4 minutes under load).
            self._transport.close()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            use_congestion_control(sock)
            self._sock = SocketOptions(sock)
        self._transport.set_write_buffer_limits(high=HIGH_WATER)
        if sock is not None and delivery_rate(sock) is not None:
            self._bound_queue(MIN_QUEUE)  # (until the kernel measured the link)
        self._begin_handshake(_endpoint(transport, "peername"), _endpoint(transport, "sockname"))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.bytes_received += nbytes
        try:
            self._reader.buffer_updated(nbytes)
            while (ev := self._reader.next_event()) is not None:
                if isinstance(ev, Frame):
                    self._on_frame(ev)
                else:
                    self._on_payload(ev)
            if self._reader.payload_landed and self._reader.receiving_payload:
                assert self._handler is not None  # (a payload in progress: past the handshake)
                self._handler.on_progress(self, self._reader.payload_landed)
            self._wake_at(self._reader.payload_left)
        except (ProtocolError, AuthenticationError) as e:
            self.abort(e)

    def _wake_at(self, left: int) -> None:
        """Let the kernel wake us once ``RECV_LOW_WATER`` bytes can be read, or the
        ``left`` bytes of a payload still to come if fewer, and for any byte between
        payloads (a header's length is not known before it is read). No byte we wait for
        is one the peer will not send (it sends frames whole: the payload's rest comes, or
        the peer hangs, which a request's timeout sees, or closes, which wakes us at
        once). Set about three times a payload (a call costs microseconds), and never
        above half the receive window (io/recv_window.py), read again only while the mark
        could reach it."""
        want = min(left, RECV_LOW_WATER) if left > 0 else 1
        if want == self._low_water or (sock := self._options()) is None:
            return
        if window_needed(want, self._window):
            self._window = receive_window(sock)
            want = wake_mark(want, self._window)
        if want != self._low_water:
            with contextlib.suppress(OSError):  # (closing under us: the read ends anyway)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                self._low_water = want

    def bulk_bytes(self) -> int | None:
        """The most chunk bytes the next frame may carry: about ``QUEUE_SECONDS`` of the
        link's delivery rate, the bound this connection keeps on what is queued ahead of
        a frame sent now (io/send_queue.py says why). None: no bound (a chunk goes in
        one frame), where the kernel does not measure the link."""
        if self._queue_bound is None:  # (set only where the socket is known: _bound_queue)
            return None
        now = self._loop.time()
        if now - self._rate_at >= RATE_EVERY and (sock := self._options()) is not None:
            self._rate_at = now
            sample = delivery_rate(sock)
            if sample is not None:
                level = queue_bytes(self._drain.sample(*sample))
                if level != self._queue_bound:
                    self._bound_queue(level)
        return self._queue_bound

    def _bound_queue(self, nbytes: int) -> None:
        """Queue at most about ``nbytes`` in the transport and unsent in the kernel."""
        assert self._transport is not None and self._sock is not None
        if limit_unsent(self._sock, nbytes):
            self._queue_bound = nbytes
            self._transport.set_write_buffer_limits(high=nbytes)

    def restart_congestion(self) -> None:
        """Begin the connection's congestion control afresh (restart_congestion_control):
        it is to carry a stream again after a while without one."""
        sock = self._options()
        if sock is not None and restart_congestion_control(sock):
            self.congestion_restarts += 1

    def _options(self) -> SocketOptions | None:
        """The socket's options while the transport is open, else None: once it closes, the
        descriptor ``_sock`` names is closed or about to be, and the kernel may give its
        number to another socket."""
        tr = self._transport
        return self._sock if tr is not None and not tr.is_closing() else None

    def eof_received(self) -> bool:
        if not self._reader.at_frame_boundary:
            self.error = self.error or TransferError(
                f"peer {self.peer or '?'} closed the connection mid-frame"
            )
        return False

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        err = self.error or (
            TransferError(f"connection to {self.peer or '?'} lost: {exc}") if exc else None
        )
        self.error = err
        self._can_write.set()  # wake senders; they will see the closed transport
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if not self.ready.done():
            self.ready.set_exception(
                err or AuthenticationError("peer closed the connection during the handshake")
            )
            self.ready.exception()  # mark retrieved: a failed dial is reported via connect()
        if not self.closed.done():
            self.closed.set_result(None)
        if self._handler is not None:
            self._handler.on_close(self, err)

    # -- frames ------------------------------------------------------------------------------

    def _on_frame(self, ev: Frame) -> None:
        msg = ev.msg
        if self.ready.done():
            assert self._handler is not None
            if isinstance(msg, Packed):
                return  # its payload lands in a buffer of the reader's; unpacked below
            sink = self._handler.on_frame(self, msg, ev.payload_len)
            if sink is not None:
                self._reader.set_sink(sink)
            elif ev.payload_len == 0 and msg.HAS_PAYLOAD:
                pass  # delivered as an empty Payload next
            return
        self._handshake(msg)

    def divert_payload(self) -> None:
        """The payload being received goes to a throwaway buffer from now on."""
        self._reader.divert()

    async def quiesce(self) -> None:
        """Return once nothing received before a divert can still land in the old memory:
        at once here (a socket read lands where the reader says at the moment it reads)."""

    def _on_payload(self, ev: Payload) -> None:
        assert self._handler is not None
        if isinstance(ev.msg, Packed):
            data = b"".join(ev.parts) if len(ev.parts) != 1 else ev.parts[0]
            self._on_frame(Frame(unpack(data), 0))
            return
        self._handler.on_payload(self, ev.msg, ev.parts)

    def _handshake(self, msg: Message) -> None:
        if isinstance(msg, Error):
            raise AuthenticationError(f"peer refused the handshake: {msg.code}: {msg.message}")
        if self._client_hs is not None:
            if isinstance(msg, Challenge):
                self._write(self._client_hs.on_challenge(msg))
                return
            if isinstance(msg, Welcome):
                self._client_hs.on_welcome(msg)
                self._open(self._client_hs.peer, self._client_hs.keys())
                return
        elif self._server_hs is not None:
            if isinstance(msg, Hello):
                self._write(self._server_hs.on_hello(msg))
                return
            if isinstance(msg, Auth):
                self._write(self._server_hs.on_auth(msg))
                self._open(self._server_hs.peer, self._server_hs.keys())
                return
        raise ProtocolError(f"unexpected {type(msg).__name__} during the handshake")

    def _open(self, peer: str | None, keys: SessionKeys) -> None:
        """The handshake is done: every frame from now on is sealed and must open."""
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self.peer = peer
        self._sealer = FrameSealer(keys.send)
        self._reader.opener = FrameOpener(keys.recv)
        self._reader.limits = self._limits
        self._handler = self._handler_factory(self)
        self.ready.set_result(None)

    # -- sending -----------------------------------------------------------------------------

    def _write(self, msg: Message, payload: Sequence[Buffer] = ()) -> None:
        tr = self._transport
        if tr is None or tr.is_closing():
            raise TransferError(f"connection to {self.peer or '?'} is closed")
        header, payload = encode_frame(msg, payload, self._sealer)
        n = sum(len(p) for p in payload)
        tr.write(header)
        for p in payload:
            if len(p):
                tr.write(p)
        self.bytes_sent += len(header) + n

    async def send(self, msg: Message, payload: Sequence[Buffer] = ()) -> None:
        """Send one frame; waits while the write buffer is above its high-water mark.

        Payload buffers may be referenced, not copied, until written: they must not change
        until the frame is on the wire (the publisher's mutability contract covers this).
        """
        await self._can_write.wait()
        self._write(msg, payload)

    def send_nowait(self, msg: Message, payload: Sequence[Buffer] = ()) -> None:
        """Send without waiting for buffer space (small control frames only)."""
        self._write(msg, payload)

    @property
    def unsent(self) -> int:
        """Bytes sent that still wait in our buffers (still referenced by us)."""
        tr = self._transport
        return tr.get_write_buffer_size() if tr is not None and not tr.is_closing() else 0

    @property
    def flushed(self) -> int:
        """Bytes of what was sent that the kernel has taken (no longer referenced by us)."""
        return self.bytes_sent - self.unsent

    def pause_reading(self) -> None:
        """Stop reading (the peer's sends then back up: what backpressure tests use)."""
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()

    def kill(self) -> None:
        """Drop the connection at once, no goodbye: a crashed peer, as the other end sees it."""
        if self._transport is not None:
            self._transport.abort()

    async def wait_flushed(self, mark: int) -> None:
        """Return once every byte up to ``mark`` of :attr:`bytes_sent` left our buffers.

        uvloop writes payload memoryviews by reference, so a buffer handed to :meth:`send`
        is still read until then; this is what the mutability contract waits on.
        """
        # Transports signal only the low-water mark, not "fully flushed": poll, each wait
        # as long as what is left ahead of ``mark`` takes at the pace bytes have been
        # leaving (a 4 MiB chunk on a 1 Gbit/s link: a few wakeups, where a fixed 1 ms
        # poll took 33 per chunk, on every serving connection, for the whole transfer).
        while not self.is_closing:
            now, flushed = self._loop.time(), self.flushed
            if flushed >= mark:
                return
            wait = flush_poll(mark - flushed, self._drained, now, flushed)
            self._drained = (now, flushed)
            await asyncio.sleep(wait)

    @property
    def handler(self) -> Handler | None:
        """The handler made for this connection once its handshake completed."""
        return self._handler

    @property
    def is_closing(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    def abort(self, exc: BaseException) -> None:
        """Drop this connection because of ``exc``; best effort to tell the peer why."""
        log.warning("dropping connection %s<->%s: %s", self.node, self.peer or "?", exc)
        self.error = exc
        tr = self._transport
        if tr is not None and not tr.is_closing():
            code = "auth" if isinstance(exc, AuthenticationError) else "protocol"
            with contextlib.suppress(Exception):  # best effort: the peer may be gone
                tr.write(encode_header(Error(code, str(exc)[:512]), 0, self._sealer))
            tr.close()

    def close(self) -> None:
        self._close_asked = True
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def shed(self) -> None:
        """Drop a connection still handshaking to make room for a newer one (quietly: under
        a flood this happens for every accepted socket)."""
        log.debug("%s: shedding an unauthenticated connection", self.node)
        self.error = AuthenticationError("too many unauthenticated connections; shed")
        if self._transport is not None:
            self._transport.abort()

    async def aclose(self, grace: float = CLOSE_GRACE) -> None:
        """Close, letting what is buffered go out for up to ``grace`` seconds, then abort:
        a peer that reads nothing never takes it."""
        self.close()
        if await _settled(self.closed, grace):
            return
        tr = self._transport
        log.warning(
            "%s: %s had not taken %d buffered bytes after %.1fs of closing; aborting",
            self.node,
            self.peer or "?",
            tr.get_write_buffer_size() if tr is not None else 0,
            grace,
        )
        self.kill()
        if not await _settled(self.closed, grace):  # (no transport was ever made)
            log.warning("%s: the connection to %s did not close", self.node, self.peer or "?")


async def _settled(fut: asyncio.Future[None], seconds: float) -> bool:
    """Whether ``fut`` is done within ``seconds`` (it is not cancelled either way)."""
    done, _ = await asyncio.wait([fut], timeout=seconds)
    return bool(done)


def _endpoint(transport: asyncio.BaseTransport, which: str) -> str:
    """ "ip:port" of a socket transport's peer or local end ("" where there is none)."""
    addr = transport.get_extra_info(which)
    if not isinstance(addr, tuple) or len(addr) < 2:
        return ""
    host = str(addr[0])
    return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"


class Server:
    """A listening socket that turns each accepted connection into a :class:`Connection`."""

    def __init__(
        self,
        server: asyncio.Server,
        conns: set[Connection],
        closing: list[bool],
        accept: Callable[[], Connection],
    ) -> None:
        self._server = server
        self.connections = conns
        self._closing = closing  # (read by listen's factory: a late accept closes at once)
        self.accept = accept
        """What the listener calls for each accepted socket (``listen``'s factory)."""
        host, port = server.sockets[0].getsockname()[:2]
        self.address = f"{host}:{port}"
        """Where it listens ("host:port"); still known after close."""

    async def close(self) -> None:
        """Stop accepting and close every connection. An accept already under way when the
        listener closes still makes a connection: it is closed as it comes (``listen``)."""
        self._closing[0] = True
        self._server.close()
        await asyncio.gather(*(c.aclose() for c in list(self.connections)))
        await self._server.wait_closed()


async def listen(
    addr: str,
    *,
    node: str,
    secret: bytes,
    handler_factory: Callable[[Connection], Handler],
    limits: Limits = DEFAULT_LIMITS,
    max_unauthenticated: int = MAX_UNAUTHENTICATED,
) -> Server:
    """Listen on ``addr`` (``host:0`` picks a free port; see ``Server.address``)."""
    host, port = parse_address(addr)
    conns: set[Connection] = set()
    handshaking: dict[Connection, None] = {}  # insertion order: oldest first
    closing = [False]  # Server.close began

    def factory() -> Connection:
        conn = Connection(
            node=node, secret=secret, client=False, handler_factory=handler_factory, limits=limits
        )
        conns.add(conn)
        handshaking[conn] = None
        conn.closed.add_done_callback(lambda _f: conns.discard(conn))
        conn.ready.add_done_callback(lambda _f: handshaking.pop(conn, None))
        conn.closed.add_done_callback(lambda _f: handshaking.pop(conn, None))
        if len(handshaking) > max_unauthenticated:
            oldest = next(iter(handshaking))
            handshaking.pop(oldest)
            oldest.shed()
        if closing[0]:
            conn.close()  # (carried out once its transport is made: connection_made)
        return conn

    server = await asyncio.get_running_loop().create_server(factory, host, port)
    return Server(server, conns, closing, factory)


def _close_unless_taken(made: asyncio.Task[tuple[asyncio.BaseTransport, Connection]]) -> None:
    """A dial ended: close the connection it made unless its caller took it."""
    if made.cancelled() or made.exception() is not None:
        return
    transport, conn = made.result()
    if not conn.taken:
        transport.close()


async def connect(
    addr: str,
    *,
    node: str,
    secret: bytes,
    handler_factory: Callable[[Connection], Handler],
    limits: Limits = DEFAULT_LIMITS,
    timeout: float = HANDSHAKE_TIMEOUT,
) -> Connection:
    """Dial ``addr`` and complete the handshake; raises AuthenticationError / TransferError."""
    host, port = parse_address(addr)
    loop = asyncio.get_running_loop()
    made = loop.create_task(
        loop.create_connection(
            lambda: Connection(
                node=node,
                secret=secret,
                client=True,
                handler_factory=handler_factory,
                limits=limits,
            ),
            host,
            port,
        )
    )
    # Not asyncio.wait_for: on Python < 3.12, a dial cancelled (a node closing) just as the
    # connection was made lost the connection, and its socket was left to the collector
    # (an "unclosed socket" ResourceWarning in the suite, now and then).
    try:
        done, _ = await asyncio.wait({made}, timeout=timeout)
    finally:
        if not made.done():
            made.cancel()
        made.add_done_callback(_close_unless_taken)
    if not done or made.cancelled():
        raise TransferError(f"cannot connect to {addr}: no connection in {timeout}s")
    try:
        _tr, conn = made.result()
    except OSError as e:
        raise TransferError(f"cannot connect to {addr}: {e}") from e
    conn.taken = True
    try:
        await asyncio.wait_for(asyncio.shield(conn.ready), timeout)
    except asyncio.TimeoutError:
        conn.close()
        raise TransferError(f"handshake with {addr} timed out after {timeout}s") from None
    except BaseException:  # refused, or the dial was cancelled (the node is closing)
        conn.close()
        raise
    return conn

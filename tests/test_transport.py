"""The real transports on loopback: handshake, zero-copy transfer and every failure path.

The transfer tests run over TCP and over UCX (ucxx on loopback TCP, ``UCX_TLS=tcp``); the
ones that inject raw bytes into a socket are TCP's alone."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tensorhub.core.errors import (
    AuthenticationError,
    ChecksumMismatch,
    RemoteError,
    TransferError,
)
from tensorhub.core.messages import GetChunk
from tensorhub.core.swarm.presets import preset
from tensorhub.core.wire import encode_header
from tensorhub.dataplane.node import Node
from tensorhub.dataplane.peer import MAX_QUEUED_REQUESTS, PeerHandler
from tensorhub.dataplane.store import Replica
from tensorhub.io import recv_window, tcp, ucx
from tensorhub.io.tensors import TensorBytes, empty_like_manifest

from .models import awkward, every_dtype, same_bytes
from .transports import routed

SECRET = b"test-secret"


@contextlib.asynccontextmanager
async def nodes(
    n: int, secret: bytes = SECRET, transport: str = "tcp"
) -> AsyncIterator[list[Node]]:
    started = [await Node.start(f"n{i}", secret=secret, transport=transport) for i in range(n)]
    routed(*started)
    try:
        yield started
    finally:
        for node in started:
            await node.close()


def big_model(mib: int = 32) -> dict[str, torch.Tensor]:
    return {"w": torch.arange(mib << 18, dtype=torch.float32), "b": torch.ones(3)}


@pytest.mark.parametrize("make", [every_dtype, awkward], ids=["every_dtype", "awkward"])
async def test_fetch_is_bit_identical(make: object, transport: str) -> None:
    sd = make()  # type: ignore[operator]
    async with nodes(2, transport=transport) as (a, b):
        m = a.serve("m", 1, sd, chunk_size=16384)
        into = empty_like_manifest(m)
        r = await b.fetch(a.address, "m", 1, into, expected_root=m.root)
        assert r.bytes == m.total_bytes and r.chunks == m.num_chunks
        for k, t in sd.items():
            assert same_bytes(t, into[k]), k
        # The fetcher now holds the version and serves it onward, verified.
        async with nodes(1, transport=transport) as (c,):
            again = empty_like_manifest(m)
            await c.fetch(b.address, "m", 1, again, expected_root=m.root)
            for k, t in sd.items():
                assert same_bytes(t, again[k]), k


async def test_wrong_secret_is_refused_and_server_keeps_serving(transport: str) -> None:
    async with nodes(1, transport=transport) as (a,):
        m = a.serve("m", 1, {"x": torch.ones(10)})
        async with nodes(1, secret=b"wrong", transport=transport) as (intruder,):
            with pytest.raises(AuthenticationError):
                await intruder.peer(a.address)
        async with nodes(1, transport=transport) as (b,):
            into = empty_like_manifest(m)
            await b.fetch(a.address, "m", 1, into)
            assert torch.equal(into["x"], torch.ones(10))


async def _raw_exchange(addr: str, data: bytes) -> bytes:
    host, port = tcp.parse_address(addr)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(data)
    await writer.drain()
    got = await asyncio.wait_for(reader.read(), 5)  # until the server closes on us
    writer.close()
    return got


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        encode_header(GetChunk(1, "m", 1, 0)),  # a request without authenticating first
        b"\x00" * 100,
    ],
    ids=["http", "unauthenticated_request", "zeros"],
)
async def test_strangers_are_dropped_and_learn_nothing(data: bytes) -> None:
    async with nodes(2) as (a, b):
        a.serve("m", 1, {"secret_weights": torch.full((1000,), 7.0)})
        got = await _raw_exchange(a.address, data)
        assert b"\x00\x00\xe0\x40" not in got  # no byte of the weights (7.0f) leaked
        assert len(got) < 1024  # at most an Error frame
        into = {"secret_weights": torch.zeros(1000)}
        await b.fetch(a.address, "m", 1, into)
        assert torch.equal(into["secret_weights"], torch.full((1000,), 7.0))


async def test_garbage_after_auth_drops_only_that_connection() -> None:
    async with nodes(3) as (a, b, c):
        m = a.serve("m", 1, {"x": torch.ones(100)})
        peer = await b.peer(a.address)
        transport = peer.conn._transport
        assert transport is not None
        transport.write(b"TH\x01\x00" + b"\xff" * 12)  # valid magic, absurd lengths
        await asyncio.wait_for(peer.conn.closed, 5)
        with pytest.raises(TransferError):
            await peer.get_manifest("m", 1)
        into = empty_like_manifest(m)
        await c.fetch(a.address, "m", 1, into)  # the server is fine
        await b.fetch(a.address, "m", 1, empty_like_manifest(m))  # b redials


async def test_unknown_version_is_a_clear_error(transport: str) -> None:
    async with nodes(2, transport=transport) as (a, b):
        a.serve("m", 1, {"x": torch.ones(3)})
        with pytest.raises(TransferError, match=r"unknown_version: m v2 is not held"):
            await b.fetch(a.address, "m", 2, {"x": torch.zeros(3)})
        peer = await b.peer(a.address)
        with pytest.raises(RemoteError, match="unknown_version") as info:
            await peer.get_manifest("other", 1)
        assert info.value.code == "unknown_version"  # the peer is alive; it lacks the version


async def test_peer_vanishing_mid_transfer_fails_the_fetch_cleanly(transport: str) -> None:
    async with nodes(2, transport=transport) as (a, b):
        m = a.serve("m", 1, big_model(64), chunk_size=1 << 20)
        into = empty_like_manifest(m)
        task = asyncio.create_task(b.fetch(a.address, "m", 1, into, window=2))
        while not a.handlers or not any(h.chunks_served for h in a.handlers):
            await asyncio.sleep(0.001)
        for h in list(a.handlers):
            h.conn.kill()  # like kill -9: no goodbye
        with pytest.raises(TransferError, match=r"vanished|lost|closed"):
            await task
        # b did not advertise a partial copy and can fetch again once the peer is back.
        assert len(b.store) == 0
        await b.fetch(a.address, "m", 1, into)
        assert torch.equal(into["w"], big_model(64)["w"])


async def test_corrupt_holder_is_detected(transport: str) -> None:
    async with nodes(2, transport=transport) as (a, b):
        sd = big_model(4)
        m = a.serve("m", 1, sd, chunk_size=1 << 20)
        sd["w"][12345] = -1.0  # the holder's memory no longer matches its manifest
        with pytest.raises(ChecksumMismatch, match="chunk 0 of m v1 from n0"):
            await b.fetch(a.address, "m", 1, empty_like_manifest(m))
        assert len(b.store) == 0


async def test_manifest_with_wrong_root_is_refused(transport: str) -> None:
    async with nodes(2, transport=transport) as (a, b):
        a.serve("m", 1, {"x": torch.ones(3)})
        with pytest.raises(Exception, match="expected"):
            await b.fetch(a.address, "m", 1, {"x": torch.zeros(3)}, expected_root=b"\0" * 16)


async def test_withdraw_waits_for_in_flight_uploads(transport: str) -> None:
    async with nodes(2, transport=transport) as (a, b):
        sd = big_model(64)
        m = a.serve("m", 1, sd, chunk_size=1 << 20)
        replica = a.store.get("m", 1)
        into = empty_like_manifest(m)
        task = asyncio.create_task(b.fetch(a.address, "m", 1, into, window=8))
        while replica.readers == 0:
            await asyncio.sleep(0)
        await a.withdraw("m", 1)
        # Nothing reads the publisher's memory any more: it may be mutated now.
        assert replica.readers == 0
        with pytest.raises(TransferError, match="unknown_version"):
            await task
        assert len(b.store) == 0


async def _asked_by_a_reader_that_paused(
    a: Node, b: Node, chunks: int
) -> tuple[PeerHandler, Replica, list[asyncio.Task[None]]]:
    """``b`` asks ``a`` for ``chunks`` chunks of a 64 MiB version, its reading paused."""
    m = a.serve("m", 1, big_model(64), chunk_size=1 << 20)
    peer = await b.peer(a.address)
    manifest = await peer.get_manifest("m", 1)
    peer.conn.pause_reading()
    replica = Replica(
        "m", 1, manifest, TensorBytes.for_destination(manifest, empty_like_manifest(m))
    )
    return peer, replica, [asyncio.create_task(peer.get_chunk(replica, i)) for i in range(chunks)]


async def test_slow_reader_gets_backpressure_not_unbounded_buffers(transport: str) -> None:
    async with nodes(2, transport=transport) as (a, b):
        peer, replica, tasks = await _asked_by_a_reader_that_paused(a, b, 40)
        await asyncio.sleep(0.3)
        server_conn = next(iter(a.handlers)).conn
        buffered = server_conn.unsent
        assert buffered <= tcp.HIGH_WATER + (1 << 20) + 4096, buffered
        peer.conn.resume_reading()
        await asyncio.gather(*tasks)
        assert replica.complete is False and replica.held == 40


async def test_a_node_closes_though_a_peer_reads_nothing() -> None:
    """A peer that stops reading (hung, stopped, its reads paused) leaves our uploads to
    it buffered. A graceful close waits for the peer to take them, so Node.close waited
    for good (the likely cause of tests/test_session_parity.py hanging in Node.close under
    load, session 23): now a connection aborts what the peer did not take within
    CLOSE_GRACE, and the node closes."""
    async with nodes(2) as (a, b):
        peer, replica, asked = await _asked_by_a_reader_that_paused(a, b, 40)
        server_conn = next(iter(a.handlers)).conn
        loop = asyncio.get_running_loop()
        give_up = loop.time() + 30.0
        while server_conn.unsent == 0:  # the kernel's buffers are full; ours fill
            assert loop.time() < give_up, "40 MiB asked, and nothing left in our buffers"
            await asyncio.sleep(0.01)
        t0 = loop.time()
        await asyncio.wait_for(a.close(), 4 * tcp.CLOSE_GRACE + 5.0)  # (it hung for good)
        print(f"closed in {loop.time() - t0:.2f}s")
        peer.conn.resume_reading()  # (b wakes: it reads what came, then the reset)
        results = await asyncio.wait_for(asyncio.gather(*asked, return_exceptions=True), 10)
        # What the kernel's buffers held landed, verified; the rest fails clearly.
        assert all(r is None or isinstance(r, TransferError) for r in results), results
        assert replica.held == results.count(None) < len(results)


def _congestion(conn: tcp.Connection) -> str:
    assert conn._sock is not None
    got = conn._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
    return bytes(got).rstrip(b"\0").decode()


async def test_connections_use_the_congestion_control_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TENSORHUB_TCP_CONGESTION sets the algorithm on both ends of every connection (reno:
    built into every Linux kernel, and not this host's default)."""
    monkeypatch.setenv(tcp.CONGESTION_ENV, "reno")
    async with nodes(2) as (a, b):
        m = a.serve("m", 1, big_model(1), chunk_size=65536)
        into = empty_like_manifest(m)
        await b.fetch(a.address, "m", 1, into)
        peer = await b.peer(a.address)
        served = next(iter(a.handlers)).conn
        assert (_congestion(peer.conn), _congestion(served)) == ("reno", "reno")


async def test_a_congestion_control_the_kernel_refuses_is_logged_once_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(tcp.CONGESTION_ENV, "no-such-algorithm")
    monkeypatch.setattr(tcp, "_congestion_refused", set())
    async with nodes(3) as (a, b, c):
        sd = big_model(1)
        m = a.serve("m", 1, sd, chunk_size=65536)
        for fetcher in (b, c):
            into = empty_like_manifest(m)
            await fetcher.fetch(a.address, "m", 1, into)
            assert all(same_bytes(t, into[k]) for k, t in sd.items())
    refused = [r for r in caplog.records if tcp.CONGESTION_ENV in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in refused]
    assert "no-such-algorithm refused" in refused[0].getMessage()


async def test_a_system_without_congestion_control_options_logs_it_once_and_connects(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """TCP_CONGESTION is Linux's: elsewhere the named algorithm is reported as not
    supported, once, and connections work on the host's default."""
    monkeypatch.setenv(tcp.CONGESTION_ENV, "reno")
    monkeypatch.delattr(socket, "TCP_CONGESTION")
    monkeypatch.setattr(tcp, "_congestion_refused", set())
    async with nodes(2) as (a, b):
        sd = big_model(1)
        m = a.serve("m", 1, sd, chunk_size=65536)
        into = empty_like_manifest(m)
        await b.fetch(a.address, "m", 1, into)
        assert all(same_bytes(t, into[k]) for k, t in sd.items())
    refused = [r.getMessage() for r in caplog.records if tcp.CONGESTION_ENV in r.getMessage()]
    assert len(refused) == 1 and "not supported" in refused[0], refused


async def test_request_flood_is_a_protocol_violation() -> None:
    async with nodes(2) as (a, b):
        a.serve("m", 1, big_model(1), chunk_size=4096)
        peer = await b.peer(a.address)
        assert peer.conn._transport is not None
        peer.conn._transport.pause_reading()  # never drain replies, so requests pile up
        flood = b"".join(
            encode_header(GetChunk(i, "m", 1, 0), 0, peer.conn._sealer)
            for i in range(MAX_QUEUED_REQUESTS * 4)
        )
        peer.conn._transport.write(flood)
        server = next(iter(a.handlers))
        await asyncio.wait_for(server.conn.closed, 5)
        assert "requests queued" in str(server.conn.error)


@given(st.lists(st.integers(1, 300), min_size=1, max_size=6), st.integers(1, 128))
def test_ucx_pieces_cut_every_piece_whatever_the_parts(sizes: list[int], piece: int) -> None:
    """Sender and receiver cut a payload at the same offsets (every PIECE bytes), however
    each side's memory is split; the sender copies only pieces that straddle parts."""
    data = bytes(i % 253 for i in range(sum(sizes)))
    parts, off = [], 0
    for n in sizes:
        parts.append(memoryview(data)[off : off + n])
        off += n
    out = list(ucx.pieces(parts, piece))
    assert b"".join(bytes(p) for p in out) == data
    assert all(len(p) == piece for p in out[:-1]) and 0 < len(out[-1]) <= piece
    assert sum(isinstance(p, bytearray) for p in out) <= len(sizes) - 1  # one per seam at most


async def test_closing_a_node_mid_dial_leaves_no_connection_open() -> None:
    """A dial still handshaking when its node closes is cancelled and its socket closed (a
    dial that completed after close() used to leave both ends of an in-process pair open;
    the seed probe in Hub.start made such dials common)."""
    eof = asyncio.Event()

    async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read()  # never answers the Hello; returns at EOF, when the dialler hangs up
        eof.set()
        w.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    node = await Node.start("closing", secret=SECRET)
    dial = asyncio.ensure_future(node.peer(f"{host}:{port}"))
    await asyncio.sleep(0.2)  # connected, waiting for the Challenge
    assert not dial.done()
    await node.close()
    await asyncio.wait_for(eof.wait(), 5)  # the socket was closed, not left to the GC
    assert dial.done() and not node.handlers
    with contextlib.suppress(asyncio.CancelledError, TransferError):
        dial.result()
    server.close()
    await server.wait_closed()


def _no_handler(conn: tcp.Connection) -> tcp.Handler:
    raise AssertionError("no handshake completes in these tests")


async def test_a_dial_cancelled_as_it_connects_closes_the_connection_it_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dial is cancelled (its node closing) in the very step its TCP connection is
    made: the cancellation goes through, and the connection is closed at once, not left
    to the collector (asyncio.wait_for could lose such a connection before Python 3.12)."""
    eof = asyncio.Event()

    async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read()
        eof.set()
        w.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    loop = asyncio.get_running_loop()
    real = loop.create_connection
    dials: list[asyncio.Future[tcp.Connection]] = []

    async def connecting(*args: Any, **kw: Any) -> Any:
        made = await real(*args, **kw)
        dials[0].cancel()
        return made

    monkeypatch.setattr(loop, "create_connection", connecting)
    dials.append(
        asyncio.ensure_future(
            tcp.connect(f"{host}:{port}", node="d", secret=SECRET, handler_factory=_no_handler)
        )
    )
    with pytest.raises(asyncio.CancelledError):
        await dials[0]
    await asyncio.wait_for(eof.wait(), 5)  # closed by us, promptly
    server.close()
    await server.wait_closed()


async def test_a_dial_that_never_connects_times_out_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()

    async def never(*args: Any, **kw: Any) -> Any:
        await asyncio.Event().wait()

    monkeypatch.setattr(loop, "create_connection", never)
    with pytest.raises(TransferError, match=r"no connection in 0\.1s"):
        await tcp.connect(
            "127.0.0.1:9", node="d", secret=SECRET, handler_factory=_no_handler, timeout=0.1
        )


@pytest.mark.skipif(not ucx.available(), reason="ucxx is not installed (tensorhub[ucx])")
async def test_a_closed_ucx_listener_is_kept_a_while_and_turns_endpoints_away() -> None:
    """ucxx gives its progress thread a borrowed pointer to a listener's callback data: the
    binding object outlives close() by LISTENER_GRACE, so a callback already under way
    reads live memory (it read freed memory: KeyError 'cb_func', a segfault in a later GC),
    and an endpoint it delivers after close gets no connection."""
    a = await Node.start("a", secret=SECRET, transport="ucx")
    b = await Node.start("b", secret=SECRET, transport="ucx")
    try:
        assert a._ucx_server is not None and a.ucx_address is not None
        server, addr = a._ucx_server, a.ucx_address
        binding = server._listener._listener
        await server.close()
        assert any(kept is binding for _t, kept in ucx._RETIRED)
        with pytest.raises((AuthenticationError, TransferError)):  # closed in the handshake
            await ucx.connect(addr, node="b", secret=SECRET, handler_factory=b._handler, timeout=5)
        assert not server.connections
    finally:
        await b.close()
        await a.close()


class _Payloads:
    """A handler that keeps each payload that arrives (into memory the connection gives)."""

    def __init__(self) -> None:
        self.got: asyncio.Queue[bytes] = asyncio.Queue()

    def on_frame(self, conn: tcp.Connection, msg: Any, payload_len: int) -> None:
        return None

    def on_payload(self, conn: tcp.Connection, msg: Any, parts: Any) -> None:
        self.got.put_nowait(b"".join(bytes(p) for p in parts))

    def on_close(self, conn: tcp.Connection, exc: BaseException | None) -> None:
        pass

    def on_progress(self, conn: tcp.Connection, landed: int) -> None:
        pass


@contextlib.asynccontextmanager
async def _one_payload(
    size: int,
) -> AsyncIterator[tuple[_Payloads, tcp.Server, tcp.Connection, bytes, bytes]]:
    """A listener whose connections keep what arrives, a connection to it, and one frame
    of ``size`` payload bytes to write by hand: (sink, server, conn, head, body)."""
    from tensorhub.core.messages import ManifestData
    from tensorhub.core.wire import encode_frame

    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    sink = _Payloads()
    server = await tcp.listen(
        "127.0.0.1:0", node="r", secret=SECRET, handler_factory=lambda _c: sink
    )
    try:
        conn = await tcp.connect(
            server.address, node="s", secret=SECRET, handler_factory=lambda _c: _Payloads()
        )
        head, _ = encode_frame(ManifestData(1, b"r"), [body], conn._sealer)
        yield sink, server, conn, head, body
        await conn.aclose()
    finally:
        await server.close()


@pytest.mark.parametrize(
    "first",
    [tcp.RECV_LOW_WATER + 1000, 1000, 0],
    ids=["pause-in-the-tail", "pause-early", "pause-before-payload"],
)
async def test_a_payload_that_pauses_anywhere_still_arrives(first: int) -> None:
    """The receiver asks the kernel to wake it only once RECV_LOW_WATER bytes of a payload
    can be read (SO_RCVLOWAT): it must never wait for bytes the sender does not send. A
    payload that stops short of the low-water mark, early or in its last bytes, and a
    frame whose payload comes only later, all arrive; so does the frame after it."""
    from tensorhub.core.messages import ManifestData

    async with _one_payload(tcp.RECV_LOW_WATER + 4000) as (sink, _server, conn, head, body):
        tr = conn._transport
        assert tr is not None
        wire = head + body
        cut = len(head) + first
        tr.write(wire[:cut])
        await asyncio.sleep(0.3)  # the sender pauses: nothing more comes for a while
        assert sink.got.empty()
        tr.write(wire[cut:])
        assert await asyncio.wait_for(sink.got.get(), 10) == body
        await conn.send(ManifestData(2, b"r"), [b"after"])  # the next frame, a small one
        assert await asyncio.wait_for(sink.got.get(), 10) == b"after"


async def test_the_rest_of_a_payload_is_read_at_one_wakeup() -> None:
    """Under ``RECV_LOW_WATER`` left of a payload, the kernel is asked to wake the receiver
    once all of the rest can be read, not for each segment (a relay's chunk pieces are a
    few hundred KiB: their tails were three quarters of its reads); between payloads, for
    any byte (a header's length is not known before it is read). (The rest is under half
    a new connection's receive window: see the next test for more.)"""
    async with _one_payload(50_000) as (sink, server, conn, head, body):
        tr = conn._transport
        assert tr is not None
        tr.write(head + body[:30_000])
        (receiver,) = server.connections
        rest = len(body) - 30_000
        for _ in range(1000):  # (until the receiver read what came: 10 s at most)
            if receiver._reader.payload_left == rest:
                break
            await asyncio.sleep(0.01)
        assert receiver._reader.payload_left == rest and receiver._transport is not None
        sock = receiver._transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == rest
        tr.write(body[30_000:])
        assert await asyncio.wait_for(sink.got.get(), 10) == body
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1


async def test_the_wakeup_mark_stays_within_half_the_receive_window() -> None:
    """A new connection's receive window (about 64 KiB) is under ``RECV_LOW_WATER``: a mark
    above the window is never reached by data, the kernel wakes the receiver only on a
    full buffer or a timer, and its autotuning never grows the buffer (a link's first
    chunks over a connection that had carried only news came at 12-15 % of line rate for
    0.4 s; io/recv_window.py). On a real socket: the mark set while the first bytes of a
    large payload arrived is at most half the window the kernel reports, and the payload
    arrives whole."""
    async with _one_payload(4 << 20) as (sink, server, conn, head, body):
        tr = conn._transport
        assert tr is not None
        tr.write(head + body[:20_000])
        (receiver,) = server.connections
        for _ in range(1000):  # (until the receiver read what came: 10 s at most)
            if receiver._reader.payload_left == len(body) - 20_000:
                break
            await asyncio.sleep(0.01)
        assert receiver._transport is not None
        sock = receiver._transport.get_extra_info("socket")
        window = recv_window.receive_window(sock)
        if window == recv_window.UNKNOWN:
            pytest.skip("the kernel does not report the receive window here (tcp_info: Linux)")
        mark = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)
        assert 1 < mark <= window // 2  # (the window only grows while no data arrives)
        tr.write(body[20_000:])
        assert await asyncio.wait_for(sink.got.get(), 30) == body


class _Window:
    """Socket options whose receive window (``tcpi_rcv_ssthresh``) a test sets; it records
    the marks set and the windows read."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.reads = 0
        self.marks: list[int] = []

    def getsockopt(self, level: int, option: int, buflen: int, /) -> bytes:
        assert option == socket.TCP_INFO
        self.reads += 1
        info = bytearray(buflen)
        struct.pack_into("=I", info, 64, self.window)
        return bytes(info)

    def setsockopt(self, level: int, option: int, value: int | bytes, /) -> None:
        assert option == socket.SO_RCVLOWAT and isinstance(value, int)
        self.marks.append(value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tcp_info is Linux's")
async def test_the_wakeup_mark_follows_the_window_and_stops_reading_it_once_large() -> None:
    """The mark is half the window while the window is small, ``RECV_LOW_WATER`` once it
    grew to twice that; the window is read only while the mark could reach it (a read
    costs a system call after a chunk's copies evicted the caches: io/sockopts.py)."""
    async with _one_payload(1000) as (_sink, _server, conn, _head, _body):
        probe = _Window(100_000)
        conn._sock = probe  # type: ignore[assignment]
        conn._low_water, conn._window = 1, 0
        conn._wake_at(1 << 20)
        assert probe.marks == [50_000]
        conn._wake_at(0)  # between payloads: any byte, no window read
        assert probe.marks == [50_000, 1] and probe.reads == 1
        probe.window = 600_000  # it grew as data came
        conn._wake_at(1 << 20)
        assert probe.marks[-1] == tcp.RECV_LOW_WATER and probe.reads == 2
        conn._wake_at(0)
        conn._wake_at(1 << 20)  # twice the mark or more: not read again
        conn._wake_at(10_000)  # (a short rest: as it is)
        assert probe.marks[-2:] == [tcp.RECV_LOW_WATER, 10_000] and probe.reads == 2


def test_a_wakeup_mark_is_within_half_the_window() -> None:
    assert recv_window.wake_mark(256 << 10, 200_000) == 100_000
    assert recv_window.wake_mark(1000, 200_000) == 1000
    assert recv_window.wake_mark(1000, 1) == 1  # (never 0: that is "any byte" anyway)
    assert recv_window.window_needed(256 << 10, 0)  # not read yet
    assert not recv_window.window_needed(1, 0)  # one byte never needs it
    assert recv_window.window_needed(256 << 10, 400_000)
    assert not recv_window.window_needed(256 << 10, 1 << 20)


class _Probe:
    """Socket options that record each call (what a closed connection must not make)."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def getsockopt(self, level: int, option: int, buflen: int, /) -> bytes:
        self.calls.append(option)
        return bytes(buflen)

    def setsockopt(self, level: int, option: int, value: int | bytes, /) -> None:
        self.calls.append(option)


async def test_a_closing_connection_sets_and_reads_no_socket_option() -> None:
    """Once its transport closes, the descriptor a connection names is closed or about to
    be, and the kernel may give its number to another socket: a chunk stream still
    running must not read that socket's delivery rate or set its options. The queue's
    bound stays as it was."""
    async with _one_payload(1000) as (_sink, _server, conn, _head, _body):
        bound = conn.bulk_bytes()
        if bound is None:
            pytest.skip("the kernel does not measure the link here (tcp_info: Linux)")
        probe = _Probe()
        conn._sock = probe  # type: ignore[assignment]
        conn._rate_at = -1e9  # (a kernel read is due)
        conn.bulk_bytes()
        assert probe.calls, "an open connection reads the kernel's rate (the probe works)"
        probe.calls.clear()
        assert conn._transport is not None
        conn._transport.close()
        conn._rate_at = -1e9
        assert conn.bulk_bytes() == bound
        conn._wake_at(5000)
        conn.restart_congestion()
        assert probe.calls == [] and conn.congestion_restarts == 0


def test_flush_polls_pace_themselves_within_bounds() -> None:
    least, most = tcp.FLUSH_POLL
    assert tcp.flush_poll(4 << 20, (0.0, 0), 5.0, 100) == least  # no pace seen yet
    # 1 Gbit/s seen (125 MB in 1 s): 4 MiB left takes 34 ms, waited for at most `most`
    assert tcp.flush_poll(4 << 20, (1.0, 0), 2.0, 125_000_000) == most
    # 3 GB/s (loopback): 1 MiB left takes 0.35 ms; never less than `least`
    assert tcp.flush_poll(1 << 20, (1.0, 0), 1.001, 3_000_000) == least
    # in between: three quarters of the time left at that pace
    assert tcp.flush_poll(500_000, (1.0, 0), 1.01, 1_250_000) == pytest.approx(0.003)


async def test_a_fetched_copy_super_seeds_when_every_holder_seeds() -> None:
    """With ``every_holder_seeds``, a holder that is not the origin hands a chunk out once
    while its one upload slot is busy, and redirects the next asker to the first: that
    node passes it on. Without the setting, the second asker queues for the same slot."""
    from tensorhub.core.errors import Refused
    from tensorhub.core.swarm.presets import preset

    # (a long window: a loaded machine may take seconds between the two requests)
    seeding = preset("node:every_holder_seeds=true:upload_slots=1:reserve_after=60")
    a = await Node.start("a", secret=SECRET, transport="tcp", dataplane=seeding)
    b = await Node.start("b", secret=SECRET, transport="tcp")
    c = await Node.start("c", secret=SECRET, transport="tcp")
    try:
        m = a.serve("m", 1, big_model(16), chunk_size=8 << 20)  # a holder, not an origin
        assert a.store.get("m", 1).seeder is None

        def replica() -> Replica:
            return Replica("m", 1, m, TensorBytes.for_destination(m, empty_like_manifest(m)))

        pb, pc = await b.peer(a.address), await c.peer(a.address)
        pb.conn.pause_reading()  # b's upload stays in flight: a's only slot is busy
        rb = replica()
        first = asyncio.create_task(pb.get_chunk(rb, 0))
        await asyncio.sleep(0.3)
        with pytest.raises(Refused) as e:
            await asyncio.wait_for(pc.get_chunk(replica(), 0), 10)
        assert e.value.holders == ["b"]
        seeder = a.store.get("m", 1).seeder
        assert seeder is not None and not seeder.origin  # a fetched copy's: no WAN rule
        pb.conn.resume_reading()
        await asyncio.wait_for(first, 10)
        assert rb.have[0]
        await asyncio.wait_for(pc.get_chunk(replica(), 1), 10)  # a chunk not sent yet: served
    finally:
        for n in (a, b, c):
            await n.close()


def test_a_holder_that_is_not_the_origin_leaves_the_wan_to_the_owners() -> None:
    """The origin redirects a remote asker to its own datacenter's fetchers while they
    fetch; any other holder serves it its first copy (the planner's WAN owner asked)."""
    from tensorhub.core.swarm import SuperSeeder

    origin, holder = SuperSeeder(4, 1.0), SuperSeeder(4, 1.0, origin=False)
    assert not origin.decide(0, "far", 0.0, remote=True, local_busy=True).serve
    assert holder.decide(0, "far", 0.0, remote=True, local_busy=True).serve
    holder.sent(0, "near", 0.0)  # a repeat copy, though: redirected as the origin's would be
    assert holder.decide(0, "other", 0.5).holders == ("near",)


def test_a_holder_that_is_not_the_origin_spreads_a_chunk_only_while_it_is_new() -> None:
    """A fetched copy redirects askers to a chunk's first recipient only within
    ``reserve_after`` of sending it (and not with an idle slot, nor when every recipient
    died); the origin's rule waits for refusals, ten times longer for live recipients.
    Redirecting as long as the origin sent late askers on to the origin itself (simulated
    standalone step: trainer stall 9.6 s instead of 7.0; with the window 5.8 s)."""
    from tensorhub.core.swarm import SuperSeeder

    holder = SuperSeeder(4, 1.0, origin=False)
    assert holder.decide(0, "a", 10.0).serve  # a first copy
    holder.sent(0, "a", 10.0)
    assert holder.decide(0, "b", 10.5).holders == ("a",)  # new here: ask a
    assert holder.decide(0, "b", 10.5, spare=True).serve  # an idle slot: serve anyway
    assert holder.decide(0, "b", 10.5, alive=lambda g: False).serve  # a died
    assert holder.decide(0, "b", 11.0, alive=lambda g: True).serve  # no longer new
    origin = SuperSeeder(4, 1.0)
    origin.sent(0, "a", 10.0)
    assert not origin.decide(0, "b", 11.0, alive=lambda g: True).serve  # (until 21 s)


async def test_a_connection_closed_before_its_transport_is_made_closes_when_it_is() -> None:
    """A server closing while a connection it accepted was still being set up (the factory
    had run, ``connection_made`` not yet) closed that connection before it had a
    transport, which did nothing: it then authenticated, stayed open, and ``Server.close``
    waited for it for good (tests/test_session_parity.py hung 4 minutes under load)."""
    import socket

    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    conn = tcp.Connection(node="n", secret=SECRET, client=False, handler_factory=_no_handler)
    conn.close()  # (as Server.close does to every connection it has)
    try:
        await loop.connect_accepted_socket(lambda: conn, ours)
        await asyncio.wait_for(conn.closed, 2.0)  # not HANDSHAKE_TIMEOUT (10 s) later
    finally:
        theirs.close()


def _no_handler(conn: tcp.Connection) -> tcp.Handler:
    raise AssertionError("a closed connection made a handler")


async def test_a_server_closes_a_connection_it_accepts_while_closing() -> None:
    """An accept already under way when ``Server.close`` began makes a connection after
    close looked at its connections: it closes as its transport comes, not later."""
    import socket

    server = await tcp.listen("127.0.0.1:0", node="s", secret=SECRET, handler_factory=_no_handler)
    closing = asyncio.ensure_future(server.close())
    await asyncio.sleep(0)  # (the close began)
    late = server.accept()  # what the listener makes for an accept still under way
    ours, theirs = socket.socketpair()
    try:
        await asyncio.get_running_loop().connect_accepted_socket(lambda: late, ours)
        await asyncio.wait_for(late.closed, 2.0)  # not HANDSHAKE_TIMEOUT (10 s) later
        await asyncio.wait_for(closing, 2.0)
    finally:
        theirs.close()


needs_tcp_congestion = pytest.mark.skipif(
    not hasattr(socket, "TCP_CONGESTION"), reason="TCP_CONGESTION is Linux only"
)


@needs_tcp_congestion
def test_restarting_congestion_control_keeps_the_algorithm() -> None:
    """The restart moves the socket to another algorithm and back (the kernel begins an
    algorithm's state afresh when a socket moves to it): the algorithm is the one it had."""
    listener = socket.create_server(("127.0.0.1", 0))
    with listener, socket.create_connection(listener.getsockname()) as sock:
        before = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
        assert tcp.restart_congestion_control(sock)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16) == before
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"reno")
        assert tcp.restart_congestion_control(sock)  # (from reno it moves by cubic)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).startswith(b"reno")
    closed = socket.socket()
    closed.close()
    assert not tcp.restart_congestion_control(closed)  # (no error: nothing to restart)


@needs_tcp_congestion
@pytest.mark.parametrize("after", [0.05, 0.0])
async def test_a_chunk_after_a_pause_restarts_the_connections_congestion_control(
    after: float,
) -> None:
    """``DataPlaneConfig.restart_cc_after``: a chunk sent after that long without one
    begins the serving connection's congestion control afresh, once; 0 never does."""
    holder = await Node.start(
        "holder", secret=SECRET, dataplane=preset(f"node:restart_cc_after={after}")
    )
    asker = await Node.start("asker", secret=SECRET)
    routed(holder, asker)
    try:
        m = holder.serve("m", 1, big_model(2), chunk_size=1 << 20)
        peer = await asker.peer(holder.address)
        mine = Replica("m", 1, m, TensorBytes.for_destination(m, empty_like_manifest(m)))
        await peer.get_chunk(mine, 0)
        await peer.get_chunk(mine, 1)  # (back to back: no restart between these)
        (served,) = [h for h in holder.handlers if h.chunks_served]
        before = served.conn.congestion_restarts
        await asyncio.sleep(after + 0.05)
        await peer.get_chunk(mine, 2)
        assert served.conn.congestion_restarts == (before + 1 if after else 0)
        assert mine.have[0] and mine.have[1] and mine.have[2]
    finally:
        await asker.close()
        await holder.close()


async def _one_big_chunk_to_a_reader_that_paused(
    a: Node, b: Node
) -> tuple[PeerHandler, Replica, asyncio.Task[None], list[int]]:
    """``b`` asks ``a`` for the one 64 MiB chunk of a version, its reading paused, and
    waits until ``a``'s buffers hold what ``b`` did not read; the list gets the request
    id."""
    a.serve("m", 1, big_model(64), chunk_size=64 << 20)
    peer = await b.peer(a.address)
    manifest = await peer.get_manifest("m", 1)
    peer.conn.pause_reading()
    replica = Replica(
        "m", 1, manifest, TensorBytes.for_destination(manifest, empty_like_manifest(manifest))
    )
    rids: list[int] = []
    asked = asyncio.create_task(peer.get_chunk(replica, 0, issued=lambda _p, rid: rids.append(rid)))
    server = next(iter(a.handlers)).conn
    give_up = asyncio.get_running_loop().time() + 30.0
    while server.unsent == 0:  # the kernel's buffers are full; ours fill
        assert asyncio.get_running_loop().time() < give_up, "a's uploads never backed up"
        await asyncio.sleep(0.01)
    return peer, replica, asked, rids


async def test_news_goes_between_the_frames_of_a_chunk_not_behind_it() -> None:
    """A Have told while a chunk is going out reaches the asker before the rest of that
    chunk (io/send_queue.py): a chunk goes in frames no larger than the connection's
    queue bound, and news goes between them. In one frame, the Have waited behind the
    whole chunk (here 64 MiB; on a half-rate relay link, 90-125 ms behind 4 MiB ones)."""
    async with nodes(2) as (a, b):
        peer, replica, asked, _ = await _one_big_chunk_to_a_reader_that_paused(a, b)
        before = peer.conn.bytes_received
        at: list[int] = []
        stop = b.watch_haves("m", 1, lambda _addr, _chunks: at.append(peer.conn.bytes_received))
        a.announce("m", 1, 0, ())  # (told to every peer that asked for the version)
        peer.conn.resume_reading()
        await asyncio.wait_for(asked, 30)
        stop()
        assert at, "the Have never came"
        assert at[0] - before < 32 << 20, f"the Have came after {at[0] - before} bytes"
        assert replica.held == 1


async def test_a_held_chunk_given_up_mid_way_stops_at_the_next_frame() -> None:
    """An asker that gives up a held chunk going out in frames (a link that fell behind
    takes its requests back): the holder sends no frame after the Cancel reaches it,
    ends the request with "cancelled", and the connection stays in step."""
    async with nodes(2) as (a, b):
        peer, replica, asked, rids = await _one_big_chunk_to_a_reader_that_paused(a, b)
        peer.abandon(rids[0])
        holder = next(iter(a.handlers))
        give_up = asyncio.get_running_loop().time() + 30.0
        while rids[0] not in holder._cancelled:  # (the Cancel reached the holder)
            assert asyncio.get_running_loop().time() < give_up, (
                "the holder took no note of the Cancel (the chunk had gone whole?)"
            )
            await asyncio.sleep(0.01)
        peer.conn.resume_reading()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asked, 30)
        while peer.requests_open:
            assert asyncio.get_running_loop().time() < give_up, 'no "cancelled" came'
            await asyncio.sleep(0.01)
        assert holder.conn.bytes_sent < 48 << 20, "the rest of the chunk went anyway"
        assert replica.held == 0
        await asyncio.wait_for(peer.get_chunk(replica, 0), 30)  # the connection is in step
        assert replica.held == 1


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    """A local cluster's voter ports are picked before its processes bind them. Handed
    out by the kernel (bind to 0), the same port came back to two clusters started a
    moment apart by two test workers: each took the other's voter for its own (CI,
    session 37). Drawn at random below the range the kernel gives outgoing connections,
    neither those nor another cluster's pick is likely to land on one."""
    from tensorhub.io.tcp import LOW_PORT, _ephemeral_range, free_ports

    low, high = _ephemeral_range()
    ports = free_ports(8)
    assert len(set(ports)) == 8
    if high - low >= 32:  # (Linux: the range is known)
        assert all(low <= p < high for p in ports), (ports, low, high)
        assert low == LOW_PORT
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))

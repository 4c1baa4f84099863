"""Outsiders without the secret, as separate processes where the attack needed them.

Each test names the break it guards (issue #15): a relayed handshake that let an outsider
read and write through a victim's authenticated connection (1), and pre-auth connections
held forever until real peers were locked out (2).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tensorhub.core.auth import TAG_SIZE, FrameOpener, FrameSealer
from tensorhub.core.errors import (
    AuthenticationError,
    ChecksumMismatch,
    ProtocolError,
    TransferError,
)
from tensorhub.core.messages import ChunkData, GetChunk, GetManifest, ManifestData
from tensorhub.core.wire import (
    FLAG_DIGESTED,
    PREFIX,
    Frame,
    FrameReader,
    Limits,
    Payload,
    encode_header,
)
from tensorhub.dataplane.node import Node
from tensorhub.io import tcp
from tensorhub.io.tensors import empty_like_manifest, tensor_digests

from .procs import ROOT

SECRET = "mp-secret"


def _start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    return p, p.stdout.readline()


def _stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(10)
    if p.stdout is not None:
        p.stdout.close()


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    extra = getattr(request, "param", [])
    p, line = _start(["tests.serve_proc", "--mib", "4", *extra])
    try:
        yield json.loads(line)
    finally:
        _stop(p)


@pytest.fixture
def relay(server: dict[str, Any]) -> Iterator[tuple[subprocess.Popen[str], str]]:
    p, line = _start(["tests.relay_proc", "--upstream", server["address"], "--seconds", "4"])
    try:
        words = line.split()
        assert words and words[0] == "READY", line
        yield p, words[1]
    finally:
        _stop(p)


def _relay_report(p: subprocess.Popen[str]) -> dict[str, Any]:
    assert p.stdout is not None
    out: dict[str, Any] = json.loads(p.stdout.readline())
    return out


# --- 1: a relayed handshake -------------------------------------------------------------------


async def test_relayed_handshake_is_refused_by_the_dialled_address(
    relay: tuple[subprocess.Popen[str], str],
) -> None:
    """The victim dials the outsider's address; the live node sees a Hello for another
    address and refuses it, so no authenticated connection ever exists for the relay."""
    proc, addr = relay
    victim = await Node.start("victim", secret=SECRET)
    try:
        with pytest.raises((AuthenticationError, TransferError), match="relay"):
            await victim.peer(addr)
    finally:
        await victim.close()
    report = await asyncio.to_thread(_relay_report, proc)
    assert report["welcome"] is False and report["manifest"] is False, report


async def test_relay_cannot_speak_on_a_relayed_connection(
    relay: tuple[subprocess.Popen[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the address binding (a transport that has no socket address to offer), the
    relayed handshake completes, but the outsider's injected request carries no valid MAC:
    the live node drops the connection instead of answering it."""
    proc, addr = relay
    monkeypatch.setattr(tcp, "_endpoint", lambda _t, _which: "")
    victim = await Node.start("victim", secret=SECRET)
    try:
        peer = await victim.peer(addr)  # the handshake itself gets through the relay
        await asyncio.wait_for(peer.conn.closed, 10)  # ... then the forged frame kills it
    finally:
        await victim.close()
    report = await asyncio.to_thread(_relay_report, proc)
    assert report["welcome"] is True, report
    assert report["manifest"] is False and report["upstream_closed"] == "closed", report


async def test_chunk_bytes_altered_in_transit_are_refused_by_digest(
    server: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An on-path outsider flips a bit in every chunk payload it relays (chunk frames carry
    no payload MAC): each chunk fails its committed BLAKE3 digest, the fetch fails naming
    the digest, and the bytes are never reported as verified."""
    p, line = _start(
        ["tests.relay_proc", "--upstream", server["address"], "--seconds", "6", "--flip"]
    )
    try:
        addr = line.split()[1]
        monkeypatch.setattr(tcp, "_endpoint", lambda _t, _which: "")
        victim = await Node.start("victim", secret=SECRET)
        try:
            peer = await victim.peer(addr)
            root = bytes.fromhex(server["roots"][1])
            manifest = await peer.get_manifest("big", 1, root)
            into = empty_like_manifest(manifest)
            with pytest.raises(ChecksumMismatch, match="digest"):
                await victim.fetch(addr, "big", 1, into, expected_root=root, hold=False)
        finally:
            await victim.close()
        report = await asyncio.to_thread(_relay_report, p)
        assert report["welcome"] is True and report["flipped"] >= 1, report
    finally:
        _stop(p)


# --- 1: frames after the handshake (pure) -----------------------------------------------------


def _sealed_pair() -> tuple[FrameSealer, FrameReader]:
    key = os.urandom(32)
    reader = FrameReader(Limits())
    reader.opener = FrameOpener(key)
    return FrameSealer(key), reader


def _feed(reader: FrameReader, data: bytes) -> list[Frame | Payload]:
    out: list[Frame | Payload] = []
    view = memoryview(data)
    while view:
        buf = reader.get_buffer()
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        reader.buffer_updated(n)
        view = view[n:]
        while (ev := reader.next_event()) is not None:
            out.append(ev)
    return out


def test_sealed_frames_round_trip_with_payloads() -> None:
    sealer, reader = _sealed_pair()
    data = os.urandom(10_000)
    wire = encode_header(GetChunk(1, "m", 1, 0), 0, sealer)
    wire += encode_header(ChunkData(1, 0), len(data), sealer, [data[:3000], data[3000:]]) + data
    evs = _feed(reader, wire)
    assert isinstance(evs[0], Frame) and isinstance(evs[-1], Payload)
    assert b"".join(bytes(p) for p in evs[-1].parts) == data


@pytest.mark.parametrize("where", ["header", "tag", "payload"])
def test_an_altered_frame_kills_the_reader(where: str) -> None:
    sealer, reader = _sealed_pair()
    data = os.urandom(1000)
    wire = bytearray(encode_header(ManifestData(1, b"r"), len(data), sealer, [data]) + data)
    at = {"header": PREFIX.size + 2, "tag": len(wire) - len(data) - TAG_SIZE, "payload": -1}
    wire[at[where]] ^= 1
    with pytest.raises((AuthenticationError, ProtocolError)):
        _feed(reader, bytes(wire))
    with pytest.raises(ProtocolError, match="closed"):
        reader.next_event()


def test_a_chunk_payload_carries_no_tag_and_the_flag_is_authenticated() -> None:
    """Chunk payloads are vouched for by the committed digests, not the frame MAC: an
    altered chunk payload passes the reader (the fetcher's digest check refuses it), but
    the flag that says so sits under the header tag: setting it on another message, or
    clearing it on a chunk, fails authentication."""
    sealer, reader = _sealed_pair()
    data = bytearray(os.urandom(1000))
    wire = bytearray(encode_header(ChunkData(1, 0), len(data), sealer, [data]) + data)
    assert wire[3] & FLAG_DIGESTED
    wire[-1] ^= 1
    evs = _feed(reader, bytes(wire))
    assert isinstance(evs[-1], Payload) and bytes(evs[-1].parts[0]) != bytes(data)
    for msg in (ManifestData(1, b"r"), ChunkData(1, 0)):
        sealer, reader = _sealed_pair()
        wire = bytearray(encode_header(msg, len(data), sealer, [data]) + data)
        wire[3] ^= FLAG_DIGESTED
        with pytest.raises(AuthenticationError):
            _feed(reader, bytes(wire))


def test_replayed_reordered_and_unsealed_frames_are_refused() -> None:
    sealer, reader = _sealed_pair()
    first = encode_header(GetManifest(1, "m", 1), 0, sealer)
    second = encode_header(GetManifest(2, "m", 1), 0, sealer)
    _feed(reader, first)
    with pytest.raises(AuthenticationError, match="frame 1"):
        _feed(reader, first)  # replay: sealed for sequence number 0
    sealer, reader = _sealed_pair()
    first = encode_header(GetManifest(1, "m", 1), 0, sealer)
    second = encode_header(GetManifest(2, "m", 1), 0, sealer)
    with pytest.raises(AuthenticationError, match="frame 0"):
        _feed(reader, second + first)  # reordered
    _sealer, reader = _sealed_pair()
    with pytest.raises(ProtocolError, match="unauthenticated frame"):
        _feed(reader, encode_header(GetManifest(1, "m", 1)))


def test_a_frame_sealed_for_the_other_direction_is_refused() -> None:
    """Each direction has its own key: a node's own frames reflected back do not open."""
    key_out, key_in = os.urandom(32), os.urandom(32)
    reader = FrameReader(Limits())
    reader.opener = FrameOpener(key_in)
    with pytest.raises(AuthenticationError):
        _feed(reader, encode_header(GetManifest(1, "m", 1), 0, FrameSealer(key_out)))


# --- 2: pre-auth connections ------------------------------------------------------------------


async def test_accepting_side_times_out_a_silent_handshake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tcp, "HANDSHAKE_TIMEOUT", 0.3)
    node = await Node.start("n", secret=SECRET)
    try:
        host, port = tcp.parse_address(node.address)
        r, w = await asyncio.open_connection(host, port)
        assert await asyncio.wait_for(r.read(), 5) is not None  # EOF: the node hung up
        w.close()
    finally:
        await node.close()


@pytest.mark.parametrize("server", [["--nofile", "256"]], indirect=True)
async def test_a_flood_of_idle_sockets_does_not_lock_real_peers_out(
    server: dict[str, Any],
) -> None:
    """400 idle connections against a node limited to 256 file descriptors: it sheds the
    oldest handshakes, and a real peer still authenticates and fetches bit-exactly."""
    host, port = tcp.parse_address(server["address"])
    idle = []
    try:
        for _ in range(400):
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):  # connecting in the background
                s.connect((host, port))
            idle.append(s)
        await asyncio.sleep(0.5)
        node = await Node.start("client", secret=SECRET)
        try:
            peer = await node.peer(server["address"])
            m = await peer.get_manifest("dtypes", 1)
            into = empty_like_manifest(m)
            await node.fetch(server["address"], "dtypes", 1, into)
            assert tensor_digests(into) == server["digests"]
        finally:
            await node.close()
    finally:
        for s in idle:
            s.close()

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorhub.core.errors import ProtocolError
from tensorhub.core.messages import ChunkData, Error, GetChunk, Hello, ManifestData, Message
from tensorhub.core.wire import (
    MAGIC,
    PREFIX,
    PROTO_VERSION,
    Frame,
    FrameReader,
    Limits,
    Payload,
    encode_header,
)

BIG = Limits(max_header=64 << 10, max_payload=16 << 20)


def _feed(reader: FrameReader, data: bytes, cuts: list[int] | None = None) -> list[object]:
    """Feed ``data`` in pieces (at ``cuts``), honouring get_buffer's size; collect events."""
    events: list[object] = []
    pos = 0
    bounds = [*sorted(set(c for c in cuts or [] if 0 < c < len(data))), len(data)]
    for end in bounds:
        while pos < end:
            buf = reader.get_buffer()
            n = min(len(buf), end - pos)
            buf[:n] = data[pos : pos + n]
            reader.buffer_updated(n)
            pos += n
            while (ev := reader.next_event()) is not None:
                events.append(ev)
    return events


def _frames() -> tuple[bytes, list[tuple[Message, bytes]]]:
    items: list[tuple[Message, bytes]] = [
        (GetChunk(1, "policy", 7, 3), b""),
        (ChunkData(1, 3), bytes(range(256)) * 300),
        (Error("no_chunk", "nope", 2), b""),
        (ManifestData(4, b"r" * 16), b""),
        (ChunkData(5, 0), b"xyz"),
    ]
    data = b"".join(encode_header(m, len(p)) + p for m, p in items)
    return data, items


def _payloads(events: list[object]) -> list[tuple[Message, bytes]]:
    out: list[tuple[Message, bytes]] = []
    for ev in events:
        if isinstance(ev, Frame) and not ev.msg.HAS_PAYLOAD:
            out.append((ev.msg, b""))
        elif isinstance(ev, Payload):
            out.append((ev.msg, b"".join(bytes(p) for p in ev.parts)))
    return out


def test_frames_roundtrip_in_one_read() -> None:
    data, items = _frames()
    assert _payloads(_feed(FrameReader(BIG), data)) == items


@given(st.lists(st.integers(0, 80_000), max_size=30))
def test_frames_roundtrip_for_any_split(cuts: list[int]) -> None:
    data, items = _frames()
    assert _payloads(_feed(FrameReader(BIG), data, cuts)) == items


def _chunk_stream(payload: bytes) -> bytes:
    """A chunk reply carrying ``payload``, then a request: what a fetcher's reader sees."""
    return (
        encode_header(ChunkData(9, 1), len(payload))
        + payload
        + encode_header(GetChunk(10, "m", 1, 2))
    )


def _feed_sink(
    reader: FrameReader,
    data: bytes,
    cuts: list[int],
    sink: Callable[[], list[memoryview] | None],
    at_cut: Callable[[int], None] = lambda _pos: None,
) -> list[object]:
    """Feed ``data`` in pieces ending at ``cuts``; a payload goes into ``sink()`` (None:
    the reader's own buffer); ``at_cut(pos)`` runs before each piece."""
    events: list[object] = []
    pos = 0
    for end in [*sorted(set(c for c in cuts if 0 < c < len(data))), len(data)]:
        at_cut(pos)
        while pos < end:
            buf = reader.get_buffer()
            n = min(len(buf), end - pos)
            buf[:n] = data[pos : pos + n]
            reader.buffer_updated(n)
            pos += n
            while (ev := reader.next_event()) is not None:
                if isinstance(ev, Frame) and ev.payload_len and (parts := sink()) is not None:
                    reader.set_sink(parts)
                events.append(ev)
    return events


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=6), st.lists(st.integers(0, 30_000)))
def test_payload_scatters_into_sink_parts(sizes: list[int], cuts: list[int]) -> None:
    payload = bytes(i % 251 for i in range(sum(sizes)))
    reader = FrameReader(BIG, staging=1024)
    parts = [memoryview(bytearray(n)) for n in sizes]
    events = _feed_sink(reader, _chunk_stream(payload), cuts, lambda: parts)
    assert b"".join(bytes(p) for p in parts) == payload
    done = [e for e in events if isinstance(e, Payload)]
    assert len(done) == 1 and done[0].parts == [p for p in parts if len(p)]
    assert isinstance(events[-1], Frame) and events[-1].msg == GetChunk(10, "m", 1, 2)
    # At most one staging buffer's worth of the payload was copied; the rest landed in place.
    assert reader.staged_payload_bytes <= 1024 + PREFIX.size + 64 << 10


def test_sink_of_wrong_size_is_refused() -> None:
    reader = FrameReader(BIG)
    data = encode_header(ChunkData(1, 1), 10)
    buf = reader.get_buffer()
    buf[: len(data)] = data
    reader.buffer_updated(len(data))
    assert reader.next_event() == Frame(ChunkData(1, 1), 10)
    with pytest.raises(ValueError, match="sink holds 9"):
        reader.set_sink([memoryview(bytearray(9))])
    with pytest.raises(ValueError, match="writable"):
        reader.set_sink([memoryview(bytes(10))])


def _prefix(
    magic: bytes = MAGIC, proto: int = PROTO_VERSION, flags: int = 0, hlen: int = 10, plen: int = 0
) -> bytes:
    return PREFIX.pack(magic, proto, flags, hlen, plen)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (_prefix(magic=b"GE"), "bad magic"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "bad magic"),
        (_prefix(proto=9), "protocol 9"),
        (_prefix(flags=1), "flags"),
        (_prefix(hlen=0), "header of 0"),
        (_prefix(hlen=1 << 20), "header of"),
        (_prefix(plen=1 << 40), "payload of"),
        (_prefix(hlen=3) + b"\x81\xa1t", "bad frame header"),
        (_prefix(hlen=1) + b"\xc1", "bad frame header"),
        (encode_header(Error("a", "b"))[: PREFIX.size] + b"\x80" * 0, None),
    ],
)
def test_malformed_frames_raise_protocol_error(data: bytes, match: str | None) -> None:
    reader = FrameReader(BIG)
    if match is None:  # a truncated frame is not an error yet: it just needs more bytes
        assert _feed(reader, data) == []
        assert not reader.at_frame_boundary
        return
    with pytest.raises(ProtocolError, match=match):
        _feed(reader, data)
    with pytest.raises(ProtocolError, match="closed"):
        reader.get_buffer()


def _header(obj: object) -> bytes:
    import msgspec

    body = msgspec.msgpack.encode(obj)
    return struct.pack("!2sBBIQ", MAGIC, PROTO_VERSION, 0, len(body), 0) + body


@pytest.mark.parametrize(
    ("obj", "match"),
    [
        ({"t": "launch_missiles"}, "Invalid value 'launch_missiles'"),
        ({"t": "get_chunk", "req": 1, "model": "m", "version": 1}, "missing required field"),
        ({"t": "get_chunk", "req": "1", "model": "m", "version": 1, "chunk": 0}, "Expected `int`"),
        (
            {"t": "get_chunk", "req": 1, "model": "m", "version": 1, "chunk": 0, "x": 1},
            "unknown field",
        ),
        ([1, 2, 3], "Expected `object`"),
        ({"req": 1}, "missing required field `t`"),
    ],
)
def test_schema_is_strict(obj: object, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        _feed(FrameReader(BIG), _header(obj))


def test_payload_on_a_payloadless_type_is_refused() -> None:
    data = bytearray(encode_header(GetChunk(1, "m", 1, 1)))
    struct.pack_into("!Q", data, 8, 5)
    with pytest.raises(ProtocolError, match="unexpected payload"):
        _feed(FrameReader(BIG), bytes(data) + b"12345")
    with pytest.raises(ProtocolError, match="carries no payload"):
        encode_header(GetChunk(1, "m", 1, 1), 5)


def test_preauth_limits_refuse_payloads_and_big_headers() -> None:
    with pytest.raises(ProtocolError, match="payload of 3 bytes exceeds 0"):
        _feed(FrameReader(), encode_header(ChunkData(1, 1), 3) + b"abc")
    big = Hello(1, "n" * 5000, b"x" * 32)
    with pytest.raises(ProtocolError, match="header of"):
        _feed(FrameReader(), encode_header(big))


@given(st.binary(max_size=2000))
def test_random_bytes_only_ever_raise_protocol_error(data: bytes) -> None:
    reader = FrameReader(BIG)
    try:
        _feed(reader, data)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            reader.next_event()


@given(st.data())
def test_mutated_valid_streams_only_ever_raise_protocol_error(data: st.DataObject) -> None:
    raw, _items = _frames()
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(buf) - 1))
        op = data.draw(st.sampled_from(["flip", "set", "cut", "dup"]))
        if op == "flip":
            buf[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set":
            buf[i] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del buf[i : i + data.draw(st.integers(1, 50))]
        else:
            buf[i:i] = buf[i : i + data.draw(st.integers(1, 50))]
        if not buf:
            break
    reader = FrameReader(BIG)
    try:
        events = _feed(reader, bytes(buf), data.draw(st.lists(st.integers(0, len(buf)))))
    except ProtocolError:
        return
    for ev in events:
        assert isinstance(ev, Frame | Payload)


@given(
    st.lists(st.integers(1, 5000), min_size=1, max_size=6),
    st.lists(st.integers(0, 30_000)),
    st.integers(0, 30_000),
)
def test_divert_stops_writes_into_the_sink_and_keeps_the_stream_in_sync(
    sizes: list[int], cuts: list[int], divert_at: int
) -> None:
    """An abandoned chunk request: from the moment of divert, not one more byte lands in
    the sink (the caller's tensors), and the frames after it still parse."""
    payload = bytes(1 + i % 250 for i in range(sum(sizes)))  # never zero
    data = _chunk_stream(payload)
    reader = FrameReader(BIG, staging=1024)
    parts = [memoryview(bytearray(n)) for n in sizes]
    state = {"diverted": False, "snapshot": b""}

    def at_cut(pos: int) -> None:
        if not state["diverted"] and pos >= divert_at:
            reader.divert()
            state["diverted"], state["snapshot"] = True, b"".join(bytes(p) for p in parts)

    # Abandoned before its header arrived: no sink is given (the reader's own buffer).
    events = _feed_sink(
        reader, data, [*cuts, divert_at], lambda: None if state["diverted"] else parts, at_cut
    )
    if state["diverted"]:
        assert b"".join(bytes(p) for p in parts) == state["snapshot"]
    assert isinstance(events[-1], Frame) and events[-1].msg == GetChunk(10, "m", 1, 2)


def test_payload_left_counts_down_what_a_message_transport_still_posts() -> None:
    reader = FrameReader(BIG)
    data = _chunk_stream(b"x" * 1000)
    first = encode_header(ChunkData(9, 1), 1000)
    buf = reader.get_buffer()
    buf[: len(first)] = first
    reader.buffer_updated(len(first))
    assert isinstance(reader.next_event(), Frame)
    assert reader.receiving_payload and reader.payload_left == 1000
    parts = [memoryview(bytearray(600)), memoryview(bytearray(400))]
    reader.set_sink(parts)
    dest = reader.get_buffer()
    assert len(dest) == 600
    dest[:] = data[len(first) : len(first) + 600]
    reader.buffer_updated(600)
    assert reader.next_event() is None and reader.payload_left == 400
    dest = reader.get_buffer()
    dest[:] = data[len(first) + 600 : len(first) + 1000]
    reader.buffer_updated(400)
    assert isinstance(reader.next_event(), Payload)
    assert not reader.receiving_payload and reader.payload_left == 0


def test_a_message_too_large_for_a_header_travels_packed() -> None:
    """Issue #15 (4): a Raft snapshot of 1,000 versions (~108 KB) was sent inside a frame
    header (limit 64 KiB) and dropped by every receiver; it now travels as a payload."""
    from tensorhub.core.messages import Packed
    from tensorhub.core.raft.types import MsgType, RaftMessage, Snapshot
    from tensorhub.core.wire import encode_frame, unpack

    snap = Snapshot(1000, 3, b"s" * 200_000, ("a", "b", "c"))
    msg = RaftMessage(MsgType.SNAP, "a", "b", term=3, snapshot=snap)
    head, payload = encode_frame(msg)
    evs = _feed(FrameReader(Limits()), head + b"".join(bytes(p) for p in payload))
    assert isinstance(evs[0], Frame) and isinstance(evs[0].msg, Packed)
    assert isinstance(evs[1], Payload)
    assert unpack(b"".join(bytes(p) for p in evs[1].parts)) == msg
    small = GetChunk(1, "m", 1, 2)
    assert not encode_frame(small)[1]  # small messages stay headers
    with pytest.raises(ProtocolError, match="packed"):
        unpack(encode_frame(Packed(), [b"x"])[0][PREFIX.size :])


def test_a_get_chunk_from_a_link_that_is_not_lagging_reads_as_before_the_field() -> None:
    """GetChunk.lagging (a relay laggard asking the laggard before it) is left out of the
    frame when false, as ``onward`` is when true: a node that predates the field, which
    refuses unknown fields, still reads every other request."""
    import msgspec

    class Before(msgspec.Struct, frozen=True, tag="get_chunk", tag_field="t"):
        req: int
        model: str
        version: int
        chunk: int
        onward: bool = True

    plain = msgspec.msgpack.encode(GetChunk(1, "m", 2, 3))
    assert msgspec.msgpack.decode(plain, type=Before) == Before(1, "m", 2, 3)
    lagging = GetChunk(1, "m", 2, 3, lagging=True)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(lagging), type=GetChunk) == lagging

"""Frames on the wire, and a sans-IO reader that lands payloads in caller memory.

A frame is a 16-byte prefix, a msgpack header and an optional raw payload::

    magic "TH" | proto u8 | flags u8 | header_len u32 | payload_len u64 | header | payload

After the handshake every frame is authenticated (flag ``FLAG_MAC``): 32 tag bytes follow
the header (see :mod:`tensorhub.core.auth`); the reader checks the header's tag before it
hands the frame on, and the payload's as its bytes land, before it reports the payload.
A chunk's payload is the exception (flag ``FLAG_DIGESTED``, set only for message types that
declare ``DIGESTED``): its bytes are vouched for by the committed manifest's BLAKE3 chunk
digest, which the fetcher checks anyway, so a second pass over every byte would buy nothing
(see :mod:`tensorhub.core.digest`). The flag sits in the prefix, under the header's tag.

:class:`FrameReader` is a pure state machine in the style of h11: the transport asks it
where to put the next bytes (:meth:`FrameReader.get_buffer`), tells it how many arrived
(:meth:`FrameReader.buffer_updated`) and pulls events (:meth:`FrameReader.next_event`).
When a header announces a payload, the caller may hand it a *sink* — a list of
memoryviews into destination tensors — and the payload is then received straight into
them (scatter), so bulk bytes are never staged. Headers and small payloads go through a
small staging buffer; at most that buffer's size of a payload is ever copied.

Every malformed, truncated, oversized or unknown frame raises :class:`ProtocolError`; the
reader is then dead and the connection must be dropped.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import msgspec

from ..typing import Buffer
from .auth import TAGS_SIZE, FrameOpener, FrameSealer
from .errors import AuthenticationError, ProtocolError
from .messages import Message, Packed, registered

MAGIC = b"TH"
PROTO_VERSION = 8  # 6: Cancel; 7: Behind; 8: frame tags are keyed BLAKE2b (core/auth.py)
FLAG_MAC = 0x01
FLAG_DIGESTED = 0x02
PREFIX = struct.Struct("!2sBBIQ")
KiB = 1 << 10
MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Hard limits a reader enforces before it allocates or accepts anything."""

    max_header: int = 64 * KiB
    max_payload: int = 256 * MiB


PACK_OVER = 32 * KiB
"""A message whose header would be larger travels as a :class:`Packed` payload instead
(headers are capped at ``Limits.max_header``; payloads at ``max_payload``)."""

PREAUTH_LIMITS = Limits(max_header=1 * KiB, max_payload=0)
"""Until a peer has authenticated it may send only tiny headers and no payload at all."""

_encoder = msgspec.msgpack.Encoder()
_decoders: dict[int, msgspec.msgpack.Decoder[Message]] = {}


def _decoder() -> msgspec.msgpack.Decoder[Message]:
    types = registered()
    dec = _decoders.get(len(types))
    if dec is None:
        dec = msgspec.msgpack.Decoder(Message if len(types) == 0 else _union(types))
        _decoders.clear()
        _decoders[len(types)] = dec
    return dec


def _union(types: tuple[type[Message], ...]) -> type[Message]:
    from typing import Union

    return Union[types]  # type: ignore[return-value]  # noqa: UP007


def encode_header(
    msg: Message,
    payload_len: int = 0,
    sealer: FrameSealer | None = None,
    payload: Sequence[Buffer] = (),
) -> bytes:
    """Prefix and header of one frame (and, with ``sealer``, its tags, computed over
    ``payload``); the payload (if any) is written after it as is."""
    if payload_len and not msg.HAS_PAYLOAD:
        raise ProtocolError(f"{type(msg).__name__} carries no payload")
    return _head(_encoder.encode(msg), payload_len, sealer, payload, msg.DIGESTED)


def encode_frame(
    msg: Message, payload: Sequence[Buffer] = (), sealer: FrameSealer | None = None
) -> tuple[bytes, Sequence[Buffer]]:
    """A frame's head (prefix, header, tags) and the payload to write after it; a message
    without a payload whose header would exceed ``PACK_OVER`` is sent :class:`Packed`."""
    n = sum(len(p) for p in payload)
    if n and not msg.HAS_PAYLOAD:
        raise ProtocolError(f"{type(msg).__name__} carries no payload")
    header = _encoder.encode(msg)
    if len(header) > PACK_OVER and not msg.HAS_PAYLOAD:
        payload, n, header = [header], len(header), _encoder.encode(Packed())
    return _head(header, n, sealer, payload, msg.DIGESTED), payload


def _head(
    header: bytes,
    payload_len: int,
    sealer: FrameSealer | None,
    payload: Sequence[Buffer],
    digested: bool,
) -> bytes:
    if sealer is None:
        return PREFIX.pack(MAGIC, PROTO_VERSION, 0, len(header), payload_len) + header
    flags = FLAG_MAC | (FLAG_DIGESTED if digested else 0)
    head = PREFIX.pack(MAGIC, PROTO_VERSION, flags, len(header), payload_len) + header
    return head + sealer.seal(head, payload, payload_len > 0 and not digested)


def unpack(data: Buffer) -> Message:
    """The message a :class:`Packed` payload carries (checked as a header is)."""
    msg = decode_header(data)
    if isinstance(msg, Packed) or msg.HAS_PAYLOAD:
        raise ProtocolError(f"a packed {type(msg).__name__}: only payload-less messages pack")
    return msg


def head_size(prefix: Buffer) -> int:
    """Bytes from a frame's start to its payload, given its prefix (for transports that
    receive the head as one message)."""
    _magic, _proto, flags, hlen, _plen = PREFIX.unpack_from(prefix)
    return int(PREFIX.size + hlen + (TAGS_SIZE if flags & FLAG_MAC else 0))


def decode_header(data: Buffer) -> Message:
    """Decode one header's msgpack with full schema checks."""
    try:
        return _decoder().decode(data)
    except (msgspec.DecodeError, ValueError) as e:  # ValueError: e.g. invalid UTF-8
        raise ProtocolError(f"bad frame header: {e}") from None


class Frame(NamedTuple):
    """A header arrived. If ``payload_len`` > 0, call :meth:`FrameReader.set_sink` now or
    the reader allocates a buffer for the payload itself."""

    msg: Message
    payload_len: int


class Payload(NamedTuple):
    """The payload announced by the last :class:`Frame` is complete, in ``parts``."""

    msg: Message
    parts: Sequence[memoryview]


_HEAD, _SINK_PENDING, _PAYLOAD, _PAYLOAD_DONE, _DEAD = range(5)


class FrameReader:
    """Incremental, zero-copy-capable frame parser (no I/O, no clock)."""

    def __init__(self, limits: Limits = PREAUTH_LIMITS, staging: int = 64 * KiB) -> None:
        self._limits = limits
        self._buf = bytearray(max(staging, PREFIX.size + Limits().max_header + TAGS_SIZE))
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._state = _HEAD
        self._msg: Message | None = None
        self._payload_len = 0
        self._parts: list[memoryview] = []
        self._part = 0  # index of the part being filled
        self._part_off = 0  # bytes already in that part
        self.payload_landed = 0
        """Bytes of the payload in progress that are in its sink memory now (what a node
        serving a chunk as it lands may pass on; staged bytes are not there yet)."""
        self._into_sink = False  # whether the last get_buffer handed out sink memory
        self.frames = 0
        self.staged_payload_bytes = 0  # payload bytes that went through staging (copied)
        self.opener: FrameOpener | None = None
        """Set once the handshake is done: from then on every frame must be authenticated."""

    @property
    def limits(self) -> Limits:
        return self._limits

    @limits.setter
    def limits(self, limits: Limits) -> None:
        if PREFIX.size + limits.max_header + TAGS_SIZE > len(self._buf):
            raise ValueError("max_header larger than the staging buffer")
        self._limits = limits

    @property
    def at_frame_boundary(self) -> bool:
        """True when no partial frame is buffered (a clean place for the peer to stop)."""
        return self._state == _HEAD and self._start == self._end

    # -- transport side ---------------------------------------------------------------------

    def get_buffer(self) -> memoryview:
        """Where the transport should put the next received bytes (never empty)."""
        if self._state == _DEAD:
            raise ProtocolError("reader is closed after a protocol error")
        if self._state == _SINK_PENDING:
            self._default_sink()
        if self._state == _PAYLOAD and self._start == self._end and self._part < len(self._parts):
            self._into_sink = True
            return self._parts[self._part][self._part_off :]
        self._into_sink = False
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._buf) - self._end < 4 * KiB:
            self._compact()
        return self._view[self._end :]

    @property
    def receiving_payload(self) -> bool:
        """Whether a frame's payload is being received (for message transports, which
        post its pieces themselves)."""
        return self._state in (_SINK_PENDING, _PAYLOAD)

    @property
    def payload_left(self) -> int:
        """Bytes of the payload in progress not received yet."""
        if self._state == _SINK_PENDING:
            return self._payload_len
        if self._state == _PAYLOAD:
            return max(0, self._payload_len - self.payload_landed - (self._end - self._start))
        return 0

    def buffer_updated(self, n: int) -> None:
        """``n`` bytes were written into the last buffer from :meth:`get_buffer`."""
        if self._into_sink:
            if self.opener is not None:
                part = self._parts[self._part]
                self.opener.update(part[self._part_off : self._part_off + n])
            self._step_part(n)
            if self._part >= len(self._parts):
                self._state = _PAYLOAD_DONE
        else:
            self._end += n

    # -- application side -------------------------------------------------------------------

    def set_sink(self, parts: Sequence[memoryview]) -> None:
        """Receive the pending payload into ``parts`` (their lengths must sum to it)."""
        if self._state != _SINK_PENDING:
            raise RuntimeError("set_sink is only valid right after a Frame with a payload")
        views = [p.cast("B") if p.format != "B" or p.ndim != 1 else p for p in parts]
        total = sum(len(p) for p in views)
        if total != self._payload_len:
            raise ValueError(f"sink holds {total} bytes, payload is {self._payload_len}")
        if any(p.readonly for p in views):
            raise ValueError("sink parts must be writable")
        self._parts = [p for p in views if len(p)]
        self._part = 0
        self._part_off = 0
        self.payload_landed = 0
        self._state = _PAYLOAD

    def divert(self) -> None:
        """Receive the rest of the payload in progress into a throwaway buffer.

        For an abandoned request: the memory it was going into (a fetcher's tensors) must
        not be written any more, yet the bytes already on their way must still be read to
        keep the stream in sync."""
        if self._state != _PAYLOAD or self._part >= len(self._parts):
            return
        rest = [len(p) for p in self._parts[self._part :]]
        scratch = memoryview(bytearray(max(rest)))
        self._parts[self._part :] = [scratch[:n] for n in rest]

    def next_event(self) -> Frame | Payload | None:
        """The next complete event, or None when more bytes are needed."""
        if self._state == _DEAD:
            raise ProtocolError("reader is closed after a protocol error")
        if self._state == _SINK_PENDING:
            self._default_sink()
        if self._state == _PAYLOAD:
            self._drain_staging_into_sink()
        if self._state == _PAYLOAD:
            return None
        try:
            if self._state == _PAYLOAD_DONE:
                self._state = _HEAD
                if self.opener is not None:
                    self.opener.close_payload()
                return self._finish_payload()
            return self._parse_head()
        except (ProtocolError, AuthenticationError):
            self._state = _DEAD
            raise

    # -- internals --------------------------------------------------------------------------

    def _parse_head(self) -> Frame | None:
        avail = self._end - self._start
        if avail < PREFIX.size:
            return None
        magic, proto, flags, hlen, plen = PREFIX.unpack_from(self._buf, self._start)
        if magic != MAGIC:
            raise ProtocolError(f"bad magic {bytes(magic)!r}: not a tensorhub peer")
        if proto != PROTO_VERSION:
            raise ProtocolError(f"peer speaks protocol {proto}, this node speaks {PROTO_VERSION}")
        if self.opener is None and flags != 0:
            raise ProtocolError(f"frame flags {flags:#x} before the handshake, want 0")
        if self.opener is not None and flags & ~FLAG_DIGESTED != FLAG_MAC:
            raise ProtocolError(
                f"frame flags {flags:#x}, want {FLAG_MAC:#x} (an unauthenticated frame after "
                "the handshake)"
            )
        digested = bool(flags & FLAG_DIGESTED)
        if not 0 < hlen <= self._limits.max_header:
            raise ProtocolError(f"header of {hlen} bytes outside (0, {self._limits.max_header}]")
        if plen > self._limits.max_payload:
            raise ProtocolError(f"payload of {plen} bytes exceeds {self._limits.max_payload}")
        tags = TAGS_SIZE if self.opener is not None else 0
        if avail < PREFIX.size + hlen + tags:
            return None
        h0 = self._start + PREFIX.size
        if self.opener is not None:
            # Authenticate before decoding: nothing an outsider sends reaches msgpack.
            t0 = h0 + hlen
            self.opener.open_header(
                self._view[self._start : t0], self._view[t0 : t0 + tags], plen > 0 and not digested
            )
        msg = decode_header(self._view[h0 : h0 + hlen])
        if plen and not msg.HAS_PAYLOAD:
            raise ProtocolError(f"{type(msg).__name__} frame with an unexpected payload")
        if self.opener is not None and digested != msg.DIGESTED:
            raise ProtocolError(
                f"{type(msg).__name__} frame {'with' if digested else 'without'} the digested "
                "flag: only chunk payloads skip the payload tag, and they always do"
            )
        self._start = h0 + hlen + tags
        self.frames += 1
        if plen == 0 and not msg.HAS_PAYLOAD:
            return Frame(msg, 0)
        self._msg = msg
        self._payload_len = plen
        if plen == 0:  # a payload-carrying type with an empty payload: nothing to sink
            self._parts, self._part, self._part_off = [], 0, 0
            self._state = _PAYLOAD
        else:
            self._state = _SINK_PENDING
        return Frame(msg, plen)

    def _default_sink(self) -> None:
        self.set_sink([memoryview(bytearray(self._payload_len))])

    def _drain_staging_into_sink(self) -> None:
        while self._start < self._end and self._part < len(self._parts):
            part = self._parts[self._part]
            n = min(len(part) - self._part_off, self._end - self._start)
            part[self._part_off : self._part_off + n] = self._view[self._start : self._start + n]
            if self.opener is not None:
                self.opener.update(part[self._part_off : self._part_off + n])
            self._start += n
            self.staged_payload_bytes += n
            self._step_part(n)
        if self._start == self._end:
            self._start = self._end = 0
        if self._part >= len(self._parts):
            self._state = _PAYLOAD_DONE

    def _step_part(self, n: int) -> None:
        self.payload_landed += n
        self._part_off += n
        if self._part_off == len(self._parts[self._part]):
            self._part += 1
            self._part_off = 0

    def _finish_payload(self) -> Payload:
        msg, parts = self._msg, self._parts
        assert msg is not None
        self._msg, self._parts = None, []
        self.payload_landed = 0
        return Payload(msg, parts)

    def _compact(self) -> None:
        n = self._end - self._start
        self._buf[:n] = self._buf[self._start : self._end]
        self._start, self._end = 0, n

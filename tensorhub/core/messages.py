"""Every message tensorhub sends, as frozen msgspec structs encoded as msgpack maps.

A message travels as a frame header (see :mod:`tensorhub.core.wire`); the ``t`` field tags
its type. Decoding is strict: unknown types, unknown fields, missing fields and wrong types
are all refused. Bulk bytes (a chunk, a manifest) never go inside a header: they follow it
as the frame's raw payload, so they can land straight in tensor memory.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from .naming import ShardKey


class Message(msgspec.Struct, frozen=True, tag_field="t", forbid_unknown_fields=True):
    """Base of all wire messages."""

    HAS_PAYLOAD = False  # class attribute, not a field: True for types followed by raw bytes
    DIGESTED = False
    """True where the receiver checks the payload against a committed BLAKE3 digest itself,
    so the frame carries no payload tag (see :mod:`tensorhub.core.wire`)."""


_REGISTRY: list[type[Message]] = []
M = TypeVar("M", bound=type[Message])


def register(cls: M) -> M:
    """Add a message type to the wire union (every module that defines messages uses this)."""
    _REGISTRY.append(cls)
    return cls


def registered() -> tuple[type[Message], ...]:
    return tuple(_REGISTRY)


# --- handshake -----------------------------------------------------------------------------


@register
class Hello(Message, frozen=True, tag="hello"):
    """Client → server: who I am, a fresh nonce the server must MAC, and the address I
    reached ("ip:port"; "" where the transport has none), which both MACs bind."""

    proto: int
    node: str
    nonce: bytes
    target: str = ""


@register
class Challenge(Message, frozen=True, tag="challenge"):
    """Server → client: proof the server knows the secret, and a nonce for the client."""

    node: str
    nonce: bytes
    mac: bytes


@register
class Auth(Message, frozen=True, tag="auth"):
    """Client → server: proof the client knows the secret."""

    mac: bytes


@register
class Welcome(Message, frozen=True, tag="welcome"):
    """Server → client: authenticated; the connection is open for requests."""


@register
class Error(Message, frozen=True, tag="error"):
    """A request failed (``req`` set) or the connection is about to close (``req`` None)."""

    code: str
    message: str
    req: int | None = None


@register
class Packed(Message, frozen=True, tag="packed"):
    """A message too large for a frame header (a Raft snapshot, a large append batch),
    carried as this frame's payload: the receiving connection unpacks it and delivers the
    message inside as if it had come as a header. Never nested, never with a payload."""

    HAS_PAYLOAD = True


# --- data plane ----------------------------------------------------------------------------


@register
class GetManifest(Message, frozen=True, tag="get_manifest"):
    req: int
    key: ShardKey = msgspec.field(name="model")
    version: int


@register
class ManifestData(Message, frozen=True, tag="manifest"):
    """Reply to GetManifest; the payload is the encoded manifest."""

    HAS_PAYLOAD = True
    req: int
    root: bytes


@register
class GetChunk(Message, frozen=True, tag="get_chunk", omit_defaults=True):
    req: int
    key: ShardKey = msgspec.field(name="model")
    version: int
    chunk: int
    onward: bool = True
    """The asker will serve the chunk onward. False for a partial read (a stream's bucket,
    a rank's slice): an origin then does not count it among the chunk's recipients, whom
    it sends later askers to."""
    lagging: bool = False
    """The asker is a relay link that fell behind (ChunkPlanner.lagging) and relays from
    us, a link that fell behind before it: we park what we lack for it, as any link does,
    where a link that is not lagging is answered "busy" (see serve.serve_decision). Left
    out of the frame when false (``omit_defaults``, as ``onward`` when true): a node that
    predates it, which refuses unknown fields, reads every other request."""


@register
class ChunkData(Message, frozen=True, tag="chunk"):
    """Reply to GetChunk; the payload is the chunk's bytes from ``offset`` on, which the
    fetcher checks against the committed manifest's digest once it has them all (hence
    ``DIGESTED``). A held chunk goes in one frame; one served while it lands here (cut
    through) goes in pieces as its bytes arrive, in order, the ``last`` one only once we
    verified it, so an Error for the request can still replace a piece (the asker then
    drops what it got: no bytes of a chunk we failed to verify complete a chunk there)."""

    HAS_PAYLOAD = True
    DIGESTED = True
    req: int
    chunk: int
    offset: int = 0
    last: bool = True


@register
class Redirect(Message, frozen=True, tag="redirect"):
    """Reply to GetChunk from a super-seeding origin that already sent the chunk out:
    ``holders`` (node names) got it from us; ask them."""

    req: int
    chunk: int
    holders: list[str]


@register
class Cancel(Message, frozen=True, tag="cancel"):
    """Asker → source: we gave request ``req`` up (an endgame copy that lost, a relay link
    we stopped following), so do not send its chunk. The source answers it at once with
    Error "cancelled" where the chunk has not begun to go out (queued, or parked until it
    lands there), ends a chunk it streams while it lands at the next piece, and ignores it
    for a reply already sent: each request still gets exactly one ending frame. Without
    it a given-up request's bytes still crossed the link (and a WAN) and the asker read
    and dropped them, taking bandwidth from the copy that replaced it."""

    req: int


@register
class Behind(Message, frozen=True, tag="behind", omit_defaults=True):
    """Relay link → its upstream, the chain's head: you are slower than the origin could
    feed us (our head check, ``core/swarm/headcheck.py``), so relay from the chain's tail,
    as a link that finds itself lagging does (ChunkPlanner.told_behind). A head cannot
    tell on its own: its upstream, the origin, holds everything, so it never falls behind
    it, and nothing in the protocol's view says a NIC's rate. A hint, like Have: a wrong
    one moves a healthy head to the tail, which costs the chain about a chunk."""

    key: ShardKey = msgspec.field(name="model")
    version: int
    who: str = ""
    """To the origin: the head we found slow (empty: the receiver itself). The origin then
    sends no asker to it for a chunk at once (serve.past_laggards), where the holder view
    says it lags only a gossip round later: meanwhile the origin sent the new head back to
    the old one for each chunk the old one had asked for, which it answered "busy" until
    it had them (bench/linerate.py --case slow --victim 1: the new head took four chunks
    from it one by one, and the link after the new head fell behind it)."""


@register
class Have(Message, frozen=True, tag="have"):
    """A fetcher → the peers in the same version's swarm: it holds ``chunks`` now, verified,
    and serves them at ``addr``. Gossip carries the same news, a round (200 ms) late, when
    a 4 MiB chunk takes 33 ms at 1 Gbit/s; like gossip's, it is a hint (a wrong one costs a
    "no_chunk" reply, never wrong bytes)."""

    key: ShardKey = msgspec.field(name="model")
    version: int
    addr: str
    chunks: list[int]


# --- control plane -------------------------------------------------------------------------


@register
class RegistryRequest(Message, frozen=True, tag="reg_req"):
    """Any node → a voter: propose a registry command or read from the registry.

    ``op``: "propose" (``data`` is an encoded Proposal), "latest" (linearizable read of
    ``model``), "version" (linearizable: the manifest roots of committed version ``value``),
    "status" (the voter's Raft role, term and leader), "versions" (the voter's local view of
    ``model``'s committed versions; not linearizable).
    """

    req: int
    op: str
    model: str = ""
    data: bytes = b""
    value: int = 0


@register
class RegistryReply(Message, frozen=True, tag="reg_reply"):
    req: int
    ok: bool
    code: str = "ok"
    message: str = ""
    value: int = 0
    data: bytes = b""

"""Gossip messages. Membership updates ride on every probe message (piggybacking)."""

from __future__ import annotations

import msgspec

from ..messages import Message, register


class Update(msgspec.Struct, frozen=True, array_like=True):
    """A membership fact: ``name`` at ``addr`` (``locality``) is ``status`` at ``inc``."""

    name: str
    addr: str
    locality: str
    inc: int
    status: int
    origin: str = ""  # who declared a suspicion (counts as a Lifeguard confirmation)
    generation: int = 0  # bumped on every restart: peers drop the previous life's state


class Kv(msgspec.Struct, frozen=True, array_like=True):
    key: str
    value: bytes
    version: int
    deleted: bool = False


class NodeDelta(msgspec.Struct, frozen=True, array_like=True):
    """Keys of one node newer than the receiver has; ``reset`` replaces its whole state."""

    name: str
    generation: int
    kvs: tuple[Kv, ...]
    max_version: int
    reset: bool = False


class DigestEntry(msgspec.Struct, frozen=True, array_like=True):
    name: str
    generation: int
    max_version: int


@register
class GPing(Message, frozen=True, tag="g_ping"):
    seq: int
    frm: str
    inc: int
    target: str
    updates: tuple[Update, ...] = ()


@register
class GAck(Message, frozen=True, tag="g_ack"):
    seq: int
    frm: str
    inc: int
    target: str  # the node that was probed (acks forwarded by relays keep it)
    updates: tuple[Update, ...] = ()


@register
class GPingReq(Message, frozen=True, tag="g_ping_req"):
    seq: int
    frm: str
    inc: int
    target: str
    updates: tuple[Update, ...] = ()


@register
class GNack(Message, frozen=True, tag="g_nack"):
    seq: int
    frm: str
    target: str


@register
class GGossip(Message, frozen=True, tag="g_gossip"):
    """Membership updates on their own (besides riding on probes)."""

    frm: str
    updates: tuple[Update, ...]


@register
class GSyn(Message, frozen=True, tag="g_syn"):
    """Scuttlebutt step 1: bucket hashes of everything the sender knows."""

    frm: str
    buckets: tuple[int, ...]


@register
class GSynAck(Message, frozen=True, tag="g_synack"):
    """Step 2: the receiver's digest entries for the buckets that differ."""

    frm: str
    digest: tuple[DigestEntry, ...]
    buckets: tuple[int, ...]  # which buckets these entries cover


@register
class GDelta(Message, frozen=True, tag="g_delta"):
    """Steps 3 and 4: what the other side lacks (and, in step 3, our digest for step 4)."""

    frm: str
    deltas: tuple[NodeDelta, ...]
    digest: tuple[DigestEntry, ...] = ()
    buckets: tuple[int, ...] = ()
    reply: bool = False  # step 3 asks for a step 4


@register
class GPushPull(Message, frozen=True, tag="g_pushpull"):
    """Full membership exchange: joining, periodic anti-entropy, rediscovery."""

    frm: str
    members: tuple[Update, ...]
    reply: bool
    roster: int = 0
    """Digest of the sender's bootstrap roster (0: none). Members both sides hold identically
    from the same roster are left out of the list; ``need_full`` asks for them."""
    need_full: bool = False


@register
class GStatusReq(Message, frozen=True, tag="g_status_req"):
    """Ask a node for its membership and holder view (operators, tests)."""

    req: int


@register
class GStatusReply(Message, frozen=True, tag="g_status"):
    req: int
    me: Update
    members: tuple[Update, ...]
    holders: tuple[tuple[str, int, tuple[str, ...]], ...]  # (model, version, holder names)

"""Mutual HMAC challenge-response over the cluster secret, and the session it opens (sans-IO).

The client sends a nonce and the address it dialled; the server answers with its own nonce
and a MAC over both nonces, both names and that address; the client checks it and answers
with its MAC; the server checks that and says Welcome. Each side thus proves knowledge of
the secret without sending it, and a replayed transcript is useless because the other
side's nonce is fresh. Nonces are inputs (the driver draws them from ``os.urandom``; tests
from a seeded generator).

Why more than the handshake: proving the secret once does not bind the *connection*. A
node listening on an address others dial (a crashed voter's port) could relay a victim's
handshake to a live node and then speak on the authenticated connection itself. Two things
stop that:

- **The dialled address is bound.** The client puts the address it actually connected to
  (its socket's peer name) in Hello, both MACs cover it, and the server refuses a Hello
  whose address is not its own socket's. A relay that rewrites it breaks the client's MAC
  check; one that keeps it is refused by the server.
- **Every later frame is authenticated** (:class:`FrameSealer` / :class:`FrameOpener`) with
  per-direction keys derived from the secret, both nonces, both names and that address, and
  an implicit sequence number per direction: a frame cannot be forged, altered, replayed,
  reordered, dropped from the middle or moved to another connection without the receiver
  dropping the connection. Headers get keyed BLAKE2b-128 (RFC 7693's MAC mode), from a
  state keyed once per connection and copied per frame: a frame's tag is per-event work
  on the data path, which runs just after megabytes of copies have evicted the caches,
  and there HMAC-SHA256 through OpenSSL (which looks the digest up by name on every
  call) took about 27 µs a tag against 9 (docs/results.md, session 34). Control
  payloads get Poly1305 under a one-time key per frame (≈ 6 GB/s against SHA-256's ≈ 2).
  Chunk payloads get no tag (``has_payload=False``; the wire flag ``FLAG_DIGESTED``, under
  the header tag, says so): the fetcher checks each chunk against the committed BLAKE3
  digest anyway, which an adversary cannot match either, so a MAC would be a second pass
  over every byte for nothing (docs/results.md measures both).

What it does not do: encrypt. Anyone on the path can read manifests and weights. A peer
that holds the secret is trusted to publish (it can commit versions of its own). Run on a
network where reading weights is acceptable, or inside a tunnel (WireGuard, IPsec) when it is not.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Sequence
from typing import NamedTuple

from cryptography.hazmat.primitives.poly1305 import Poly1305

from ..typing import Buffer
from .errors import AuthenticationError, ProtocolError
from .messages import Auth, Challenge, Hello, Welcome

NONCE_SIZE = 32
TAG_SIZE = 16
TAGS_SIZE = 2 * TAG_SIZE
"""Bytes after each authenticated frame's header: the header's tag, then the payload's."""
_SERVER = b"tensorhub/auth/v2/server\0"
_CLIENT = b"tensorhub/auth/v2/client\0"
_SESSION = b"tensorhub/auth/v2/session\0"
_NO_PAYLOAD = bytes(TAG_SIZE)


def _mac(secret: bytes, role: bytes, *parts: bytes) -> bytes:
    h = hmac.new(secret, role, hashlib.sha256)
    for p in parts:
        h.update(len(p).to_bytes(4, "big"))
        h.update(p)
    return h.digest()


def _check_nonce(nonce: bytes) -> None:
    if len(nonce) != NONCE_SIZE:
        raise ProtocolError(f"nonce of {len(nonce)} bytes, want {NONCE_SIZE}")


class SessionKeys(NamedTuple):
    """One connection's frame keys, from this side's point of view."""

    send: bytes
    recv: bytes


class _Transcript(NamedTuple):
    """What a handshake binds, the same on both sides: both nonces, both names, and the
    address the client reached. Both proofs and the session keys are MACs over it."""

    client_nonce: bytes
    server_nonce: bytes
    client: str
    server: str
    target: str

    def _mac(self, secret: bytes, role: bytes, *, swap: bool = False) -> bytes:
        nonces = (self.client_nonce, self.server_nonce)
        names = (self.client.encode(), self.server.encode())
        if swap:  # the client's proof lists the other side first
            nonces, names = nonces[::-1], names[::-1]
        return _mac(secret, role, *nonces, *names, self.target.encode())

    def server_proof(self, secret: bytes) -> bytes:
        return self._mac(secret, _SERVER)

    def client_proof(self, secret: bytes) -> bytes:
        return self._mac(secret, _CLIENT, swap=True)

    def keys(self, secret: bytes, *, client: bool) -> SessionKeys:
        base = self._mac(secret, _SESSION)
        c2s, s2c = hmac.digest(base, b"c2s", "sha256"), hmac.digest(base, b"s2c", "sha256")
        return SessionKeys(send=c2s, recv=s2c) if client else SessionKeys(send=s2c, recv=c2s)


def same_endpoint(a: str, b: str) -> bool:
    """Whether two "host:port" strings name the same socket address (IPv4-mapped IPv6
    addresses compare equal to their IPv4 form)."""

    def norm(addr: str) -> tuple[str, str]:
        host, _, port = addr.rpartition(":")
        host = host.strip("[]")
        try:
            ip = ipaddress.ip_address(host)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            host = str(ip)
        except ValueError:
            pass
        return host, port

    return norm(a) == norm(b)


class ClientHandshake:
    """The connecting side: ``hello()``, then ``on_challenge()``, then ``on_welcome()``.

    ``target``: the address this connection actually reached ("ip:port" of the socket's
    peer), or "" where the transport has none to offer (then only the frame MACs bind)."""

    def __init__(
        self, secret: bytes, node: str, nonce: bytes, proto: int, target: str = ""
    ) -> None:
        _check_nonce(nonce)
        self._secret, self._node, self._nonce, self._proto = secret, node, nonce, proto
        self._target = target
        self._transcript: _Transcript | None = None
        self.peer: str | None = None
        self.done = False

    def hello(self) -> Hello:
        return Hello(self._proto, self._node, self._nonce, self._target)

    def on_challenge(self, ch: Challenge) -> Auth:
        _check_nonce(ch.nonce)
        t = _Transcript(self._nonce, ch.nonce, self._node, ch.node, self._target)
        if not hmac.compare_digest(t.server_proof(self._secret), ch.mac):
            where = f" at {self._target}" if self._target else ""
            raise AuthenticationError(
                f"this node's cluster secret does not match the one {ch.node!r}{where} uses: "
                "check the secret given to this node (TENSORHUB_SECRET, secret= or "
                "--secret-file); if they match, something between us relays the handshake"
            )
        self.peer, self._transcript = ch.node, t
        return Auth(t.client_proof(self._secret))

    def on_welcome(self, _msg: Welcome) -> None:
        if self.peer is None:
            raise ProtocolError("Welcome before Challenge")
        self.done = True

    def keys(self) -> SessionKeys:
        """This side's frame keys (valid once :attr:`done`)."""
        if not self.done or self._transcript is None:
            raise ProtocolError("no session before the handshake completes")
        return self._transcript.keys(self._secret, client=True)


class ServerHandshake:
    """The accepting side: ``on_hello()`` → Challenge, then ``on_auth()`` → Welcome.

    ``local``: the address this connection was accepted on ("ip:port" of the socket), to
    check the client's ``target`` against; "" skips the check (a transport without one)."""

    def __init__(self, secret: bytes, node: str, nonce: bytes, proto: int, local: str = "") -> None:
        _check_nonce(nonce)
        self._secret, self._node, self._nonce, self._proto = secret, node, nonce, proto
        self._local = local
        self._transcript: _Transcript | None = None
        self.peer: str | None = None
        self.done = False

    def on_hello(self, h: Hello) -> Challenge:
        if h.proto != self._proto:
            raise ProtocolError(f"peer speaks protocol {h.proto}, this node {self._proto}")
        _check_nonce(h.nonce)
        if h.target and self._local and not same_endpoint(h.target, self._local):
            raise AuthenticationError(
                f"{h.node!r} dialled {h.target} but reached this node at {self._local}: "
                "a relay (or address translation) sits between us"
            )
        t = _Transcript(h.nonce, self._nonce, h.node, self._node, h.target)
        self.peer, self._transcript = h.node, t
        return Challenge(self._node, self._nonce, t.server_proof(self._secret))

    def on_auth(self, a: Auth) -> Welcome:
        t = self._transcript
        if t is None or self.peer is None:
            raise ProtocolError("Auth before Hello")
        if not hmac.compare_digest(t.client_proof(self._secret), a.mac):
            raise AuthenticationError(f"client {self.peer!r} failed to prove the cluster secret")
        self.done = True
        return Welcome()

    def keys(self) -> SessionKeys:
        """This side's frame keys (valid once :attr:`done`)."""
        if not self.done or self._transcript is None:
            raise ProtocolError("no session before the handshake completes")
        return self._transcript.keys(self._secret, client=False)


# --- frames after the handshake --------------------------------------------------------------


class _FrameKey:
    """One direction's frame key, keyed into BLAKE2b states once: a header's tag, and a
    payload's one-time Poly1305 key, each under its own personalisation (so neither can
    stand for the other), over the frame's sequence number and what it covers."""

    def __init__(self, key: bytes) -> None:
        self._head = hashlib.blake2b(key=key, digest_size=TAG_SIZE, person=b"tensorhub/head")
        self._payload = hashlib.blake2b(key=key, digest_size=32, person=b"tensorhub/poly")

    def header_tag(self, seq: int, head: Buffer) -> bytes:
        h = self._head.copy()
        h.update(seq.to_bytes(8, "big"))
        h.update(head)
        return h.digest()

    def payload_mac(self, seq: int) -> Poly1305:
        h = self._payload.copy()
        h.update(seq.to_bytes(8, "big"))
        return Poly1305(h.digest())


class FrameSealer:
    """The sending half: tags each frame with the next sequence number of its direction."""

    def __init__(self, key: bytes) -> None:
        self._key = _FrameKey(key)
        self.seq = 0

    def seal(self, head: bytes, payload: Sequence[Buffer] = (), has_payload: bool = False) -> bytes:
        """The 32 tag bytes that follow ``head`` (prefix + msgpack header) on the wire.

        The payload is read here, so it must not change until it is on the wire (the same
        mutability contract sending already has)."""
        seq = self.seq
        self.seq += 1
        htag = self._key.header_tag(seq, head)
        if not has_payload:
            return htag + _NO_PAYLOAD
        p = self._key.payload_mac(seq)
        for part in payload:
            if len(part):
                p.update(part)
        return htag + p.finalize()


class FrameOpener:
    """The receiving half: checks each header's tag at once, and a payload's as its bytes
    land (:meth:`update` over exactly what was received, wherever it was put)."""

    def __init__(self, key: bytes) -> None:
        self._key = _FrameKey(key)
        self.seq = 0
        self._payload: Poly1305 | None = None
        self._want = b""

    def open_header(self, head: Buffer, tags: Buffer, has_payload: bool) -> None:
        seq = self.seq
        self.seq += 1
        tags = bytes(tags)
        if not hmac.compare_digest(self._key.header_tag(seq, head), tags[:TAG_SIZE]):
            raise AuthenticationError(
                f"frame {seq} failed authentication (forged, altered or out of order)"
            )
        if has_payload:
            self._payload = self._key.payload_mac(seq)
            self._want = tags[TAG_SIZE:]
        elif tags[TAG_SIZE:] != _NO_PAYLOAD:
            raise AuthenticationError(f"frame {seq} has a payload tag and no payload")

    def update(self, data: Buffer) -> None:
        if self._payload is not None and len(data):
            self._payload.update(data)

    def close_payload(self) -> None:
        p, self._payload = self._payload, None
        if p is None:
            return
        if not hmac.compare_digest(p.finalize(), self._want):
            raise AuthenticationError(
                f"the payload of frame {self.seq - 1} failed authentication (altered in transit)"
            )

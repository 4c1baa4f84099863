"""Mutual HMAC challenge-response over the cluster secret (sans-IO).

The client sends a nonce; the server answers with its own nonce and a MAC over both; the
client checks it and answers with its MAC; the server checks that and says Welcome. Each
side thus proves knowledge of the secret without sending it, and a replayed transcript is
useless because the other side's nonce is fresh. Nonces are inputs (the driver draws them
from ``os.urandom``; tests from a seeded generator).

This authenticates peers; it does not encrypt or MAC every frame. Run the cluster on a
network you trust not to be actively tampered with (or under a TLS tunnel).
"""

from __future__ import annotations

import hashlib
import hmac

from .errors import AuthenticationError, ProtocolError
from .messages import Auth, Challenge, Hello, Welcome

NONCE_SIZE = 32
_SERVER = b"tensorhub/auth/v1/server\0"
_CLIENT = b"tensorhub/auth/v1/client\0"


def _mac(secret: bytes, role: bytes, *parts: bytes) -> bytes:
    h = hmac.new(secret, role, hashlib.sha256)
    for p in parts:
        h.update(len(p).to_bytes(4, "big"))
        h.update(p)
    return h.digest()


def _check_nonce(nonce: bytes) -> None:
    if len(nonce) != NONCE_SIZE:
        raise ProtocolError(f"nonce of {len(nonce)} bytes, want {NONCE_SIZE}")


class ClientHandshake:
    """The connecting side: ``hello()``, then ``on_challenge()``, then ``on_welcome()``."""

    def __init__(self, secret: bytes, node: str, nonce: bytes, proto: int) -> None:
        _check_nonce(nonce)
        self._secret, self._node, self._nonce, self._proto = secret, node, nonce, proto
        self.peer: str | None = None
        self.done = False

    def hello(self) -> Hello:
        return Hello(self._proto, self._node, self._nonce)

    def on_challenge(self, ch: Challenge) -> Auth:
        _check_nonce(ch.nonce)
        want = _mac(
            self._secret, _SERVER, self._nonce, ch.nonce, self._node.encode(), ch.node.encode()
        )
        if not hmac.compare_digest(want, ch.mac):
            raise AuthenticationError(f"server {ch.node!r} failed to prove the cluster secret")
        self.peer = ch.node
        return Auth(
            _mac(
                self._secret, _CLIENT, ch.nonce, self._nonce, ch.node.encode(), self._node.encode()
            )
        )

    def on_welcome(self, _msg: Welcome) -> None:
        if self.peer is None:
            raise ProtocolError("Welcome before Challenge")
        self.done = True


class ServerHandshake:
    """The accepting side: ``on_hello()`` → Challenge, then ``on_auth()`` → Welcome."""

    def __init__(self, secret: bytes, node: str, nonce: bytes, proto: int) -> None:
        _check_nonce(nonce)
        self._secret, self._node, self._nonce, self._proto = secret, node, nonce, proto
        self._peer_nonce: bytes | None = None
        self.peer: str | None = None
        self.done = False

    def on_hello(self, h: Hello) -> Challenge:
        if h.proto != self._proto:
            raise ProtocolError(f"peer speaks protocol {h.proto}, this node {self._proto}")
        _check_nonce(h.nonce)
        self._peer_nonce, self.peer = h.nonce, h.node
        mac = _mac(
            self._secret, _SERVER, h.nonce, self._nonce, h.node.encode(), self._node.encode()
        )
        return Challenge(self._node, self._nonce, mac)

    def on_auth(self, a: Auth) -> Welcome:
        if self._peer_nonce is None or self.peer is None:
            raise ProtocolError("Auth before Hello")
        want = _mac(
            self._secret,
            _CLIENT,
            self._nonce,
            self._peer_nonce,
            self._node.encode(),
            self.peer.encode(),
        )
        if not hmac.compare_digest(want, a.mac):
            raise AuthenticationError(f"client {self.peer!r} failed to prove the cluster secret")
        self.done = True
        return Welcome()

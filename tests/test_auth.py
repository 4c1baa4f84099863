from __future__ import annotations

import random

import pytest

from tensorhub.core.auth import ClientHandshake, ServerHandshake
from tensorhub.core.errors import AuthenticationError, ProtocolError
from tensorhub.core.messages import Auth, Challenge, Hello


def _nonce(rng: random.Random) -> bytes:
    return rng.randbytes(32)


def _pair(seed: int, cs: bytes, ss: bytes) -> tuple[ClientHandshake, ServerHandshake]:
    rng = random.Random(seed)
    return (ClientHandshake(cs, "c", _nonce(rng), 1), ServerHandshake(ss, "s", _nonce(rng), 1))


def test_same_secret_authenticates_both_ways(seed: int) -> None:
    c, s = _pair(seed, b"k", b"k")
    ch = s.on_hello(c.hello())
    welcome = s.on_auth(c.on_challenge(ch))
    c.on_welcome(welcome)
    assert c.done and s.done and c.peer == "s" and s.peer == "c"


def test_client_refuses_a_server_without_the_secret(seed: int) -> None:
    c, s = _pair(seed, b"k", b"wrong")
    with pytest.raises(AuthenticationError, match="does not match the one 's' uses"):
        c.on_challenge(s.on_hello(c.hello()))


def test_server_refuses_a_client_without_the_secret(seed: int) -> None:
    c, s = _pair(seed, b"wrong", b"k")
    ch = s.on_hello(c.hello())
    forged = Auth(b"\0" * 32)
    with pytest.raises(AuthenticationError, match="client 'c'"):
        s.on_auth(forged)
    assert not s.done
    with pytest.raises(AuthenticationError):
        c.on_challenge(ch)


def test_replayed_auth_fails_against_a_fresh_server_nonce(seed: int) -> None:
    c, s = _pair(seed, b"k", b"k")
    auth = c.on_challenge(s.on_hello(c.hello()))
    _c2, s2 = _pair(seed + 1, b"k", b"k")
    s2.on_hello(c.hello())  # attacker replays the old Hello ...
    with pytest.raises(AuthenticationError):
        s2.on_auth(auth)  # ... and the old Auth: the server's nonce changed


def test_out_of_order_and_malformed_steps(seed: int) -> None:
    c, s = _pair(seed, b"k", b"k")
    with pytest.raises(ProtocolError, match="Auth before Hello"):
        s.on_auth(Auth(b"x"))
    with pytest.raises(ProtocolError, match="nonce"):
        s.on_hello(Hello(1, "c", b"short"))
    with pytest.raises(ProtocolError, match="protocol 2"):
        s.on_hello(Hello(2, "c", b"x" * 32))
    with pytest.raises(ProtocolError, match="nonce"):
        c.on_challenge(Challenge("s", b"short", b""))

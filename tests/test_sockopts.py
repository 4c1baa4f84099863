"""SocketOptions: a transport socket's options through C-level objects that never close it."""

from __future__ import annotations

import socket
import struct

import pytest

from tensorhub.io.sockopts import SocketOptions


def test_options_set_and_read_through_it_are_the_sockets_and_it_stays_open() -> None:
    a, b = socket.socketpair()
    try:
        opts = SocketOptions(a)
        for want in (1, 4096, 1):  # (made and detached each call: the fd stays open)
            opts.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
            assert a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == want
            got = opts.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 4)
            assert struct.unpack("i", got)[0] == want
        b.sendall(b"still open")
        assert a.recv(64) == b"still open"
    finally:
        a.close()
        b.close()


def test_an_option_on_a_closed_socket_fails_with_oserror() -> None:
    """What every caller expects of a socket closing under it (and nothing else is closed)."""
    a, b = socket.socketpair()
    opts = SocketOptions(a)
    a.close()
    b.close()
    with pytest.raises(OSError):
        opts.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)

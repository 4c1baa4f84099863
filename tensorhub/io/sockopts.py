"""Socket options of a transport's socket, set and read on the receive and send paths.

A connection sets ``SO_RCVLOWAT`` two or three times a frame and reads ``TCP_INFO`` up
to once a millisecond. uvloop hands out a ``PseudoSocket`` for a transport's socket, whose
every ``setsockopt``/``getsockopt`` builds a full Python ``socket.socket`` on the file
descriptor (its ``__init__`` is Python code) and detaches it again. Those calls come
right after a chunk's copies have evicted the caches: measured so, 21 µs a call, against
12 for a C-level ``_socket.socket`` made the same way (hot: 1.3 and 0.7 µs), and on a
relay under load ``Connection._wake_at`` was 6 % of the event loop's CPU
(docs/results.md, session 34).

Like the ``PseudoSocket``, :class:`SocketOptions` holds the descriptor's number and never
closes it: the transport owns the socket, and an option set on a socket closing under us
fails with ``OSError``, which every caller expects.
"""

from __future__ import annotations

import _socket
import socket
import sys
from typing import Protocol

_TCP_INFO = getattr(socket, "TCP_INFO", None) if sys.platform.startswith("linux") else None


class SocketLike(Protocol):
    """What the option helpers need of a socket (``socket.socket`` or :class:`SocketOptions`)."""

    def getsockopt(self, level: int, option: int, buflen: int, /) -> bytes: ...

    def setsockopt(self, level: int, option: int, value: int | bytes, /) -> None: ...


class SocketOptions:
    """``getsockopt``/``setsockopt`` on ``sock``'s descriptor, through a C-level socket
    object made for each call and detached after (see the module's docstring)."""

    __slots__ = ("_args",)

    def __init__(self, sock: socket.socket) -> None:
        # (family, type and proto given: the object is made without a system call)
        self._args = (int(sock.family), int(sock.type), sock.proto, sock.fileno())

    def getsockopt(self, level: int, option: int, buflen: int, /) -> bytes:
        s = _socket.socket(*self._args)
        try:
            return s.getsockopt(level, option, buflen)
        finally:
            s.detach()

    def setsockopt(self, level: int, option: int, value: int | bytes, /) -> None:
        s = _socket.socket(*self._args)
        try:
            s.setsockopt(level, option, value)
        finally:
            s.detach()


def tcp_info(sock: SocketLike, length: int) -> bytes | None:
    """The first ``length`` bytes of ``sock``'s ``TCP_INFO`` (``struct tcp_info`` of
    include/uapi/linux/tcp.h), or None where there are none: not Linux, a kernel whose
    struct is shorter, or a socket closing under us."""
    if _TCP_INFO is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, length)
    except OSError:
        return None
    return info if len(info) >= length else None

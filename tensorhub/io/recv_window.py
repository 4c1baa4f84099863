"""How much of a payload the kernel may let arrive before it wakes us: never more than
half the receive window.

A receiving connection asks the kernel to wake it only once ``RECV_LOW_WATER`` bytes of a
payload can be read (``SO_RCVLOWAT``, ``io.tcp.Connection._wake_at``). The sender can have
no more unread data in our socket than the window we advertise, so a mark above the window
is never reached by data: the kernel then wakes us only when the receive buffer is nearly
full in memory terms, or on a timer, and meanwhile the window is closed and the link idle.
Linux also grows a connection's receive buffer (and with it the window) only from what the
application read in one round trip beyond what is still queued (``tcp_rcv_space_adjust``,
kernels from 6.16 subtract the queue); reading a whole window at each late wakeup
measures about one read's worth, so the buffer stayed small.

That is a new connection's state: its buffer starts at ``tcp_rmem[1]`` (128 KiB) and its
window at about 64 KiB, under 256 KiB. Measured so (``bench/linerate.py --case slow``, a
job's first step, N=4, 1 Gbit/s, ``tcp_info`` at each read): a link moving to a new
upstream got its first chunks over a connection that had carried only news, with
``SO_RCVLOWAT`` 256 KiB over a window of 66-200 KiB; it read 256 KiB every 17-18 ms, its
receive buffer stayed 270 KB for up to 0.4 s (where a busy connection's is 6-7 MB), and its
first chunks came at 12-15 % of line rate; the link judged itself lagging and went to
the chain's tail behind the half-rate one (docs/results.md, session 36).

So the mark is at most half the window (``tcpi_rcv_ssthresh``, the most the receiver
advertises now): the other half stays open to the sender while we wait, each wakeup
reads what came in about half a round trip, and the kernel's autotuning sees the reads it
needs to grow the buffer. The window is read only while the mark could reach it; once it
is twice ``RECV_LOW_WATER`` it is not read again (it shrinks only under memory pressure,
where the kernel's own wakeup on a full buffer remains).
"""

from __future__ import annotations

import struct

from .sockopts import SocketLike, tcp_info

_RCV_SSTHRESH = struct.Struct("=I")
_RCV_SSTHRESH_AT = 64  # tcpi_rcv_ssthresh (include/uapi/linux/tcp.h, since 2.6)
_INFO_LEN = _RCV_SSTHRESH_AT + _RCV_SSTHRESH.size

UNKNOWN = 1 << 62
"""The window where the kernel does not say (not Linux): no bound, as before."""


def receive_window(sock: SocketLike) -> int:
    """The most the receiver advertises to the sender now (``tcpi_rcv_ssthresh``), in
    bytes; :data:`UNKNOWN` where the platform does not say (or the socket is closing under
    us: the read ends anyway)."""
    info = tcp_info(sock, _INFO_LEN)
    if info is None:
        return UNKNOWN
    (window,) = _RCV_SSTHRESH.unpack_from(info, _RCV_SSTHRESH_AT)
    return int(window) or UNKNOWN


def wake_mark(want: int, window: int) -> int:
    """The low-water mark to ask for: ``want`` bytes, but no more than half of ``window``
    (and at least one byte)."""
    return max(1, min(want, window // 2))


def window_needed(want: int, window: int) -> bool:
    """Whether a mark of ``want`` bytes could exceed half the window last read
    (``window``; 0: not read yet), so that the window must be read again before the mark
    is set (it may have grown since). A mark of one byte never needs it."""
    return want > max(1, window // 2)

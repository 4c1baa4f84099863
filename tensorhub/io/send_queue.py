"""How much chunk data a TCP connection keeps queued ahead of what it sends next.

News (``Have``), refusals ("busy"), ``Cancel`` and ``Error`` frames share a connection
with chunk data, and each waits behind every byte already handed to the transport and to
the kernel. With a fixed 4 MiB of user-space buffer, whole 4 MiB chunk frames, and the
kernel's send buffer autotuned to 4 MiB, a Have on a half-rate (500 Mbit/s) relay link
reached the next link 90-125 ms after it was sent: three to four of its upstream's chunks
late. That link judged itself slow only once it *saw* itself 7 chunks behind, 10-22
chunks into the model (the simulator, whose news is prompt: 7-9), and in two rounds of
three its refusals to its own downstream then waited 400 ms behind the data it was
relaying: every link after a slow one ran at its pace that much longer
(``bench/linerate.py --case slow``, N=4, 256 MiB, a job's first step: median 1.33x one
copy over 18 rounds; with the queue bounded, 1.22x over 30; docs/results.md, session 33).

So a connection keeps about ``QUEUE_SECONDS`` of data queued at the pace its link
delivers, measured by the kernel (``tcp_info.tcpi_delivery_rate``): that much in the
transport's buffer (its high-water mark), that much unsent in the kernel
(``TCP_NOTSENT_LOWAT``), and chunk frames no larger. On loopback or a fast NIC that is
the old 4 MiB (``MAX_QUEUE``; a fixed 512 KiB cost ``bench/hub_p2p.py`` on loopback
15-20 % of its rate); on a 1 Gbit/s link 1 MiB; on a half-rate one 512 KiB. Data in
flight (the congestion window) is not bounded: that is the fabric's queue, not ours.

The decisions here are pure (:func:`queue_bytes`, :class:`DrainRate`); reading the kernel's
sample is :func:`delivery_rate`, and applying the bound is the connection's
(``io.tcp.Connection.bulk_bytes``).
"""

from __future__ import annotations

import socket
import struct
import sys
from dataclasses import dataclass

from .sockopts import SocketLike, tcp_info

QUEUE_SECONDS = 0.01
"""Seconds of the link's delivery rate a connection keeps queued: enough that the link
stays busy while the event loop is elsewhere for a few milliseconds (9 processes on 2
cores), little enough that news sent now leaves within about that."""
MIN_QUEUE = 256 << 10
"""The least queued: one cut-through piece (``dataplane.peer.PIECE``); also the bound
before the kernel has measured the link (the first ACKs, within a round trip)."""
MAX_QUEUE = 4 << 20
"""The most queued, what every connection kept before: one default chunk."""
RATE_WEIGHT = 0.25
"""Weight of a new delivery-rate sample in the running estimate (samples are per ACK and
noisy; a level changes only at a power of two)."""

_LINUX = sys.platform.startswith("linux")  # (the tcp_info layout and option numbers below)
_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25) if _LINUX else None
_DELIVERY = struct.Struct("=Q")
_DELIVERY_AT = 160  # tcpi_delivery_rate (Linux >= 4.9: include/uapi/linux/tcp.h)
_APP_LIMITED_AT = 7  # the byte whose lowest bit is tcpi_delivery_rate_app_limited
_INFO_LEN = _DELIVERY_AT + _DELIVERY.size


def queue_bytes(rate: float) -> int:
    """Bytes to keep queued for a link delivering ``rate`` bytes a second (0: not measured
    yet): ``QUEUE_SECONDS`` of it, down to a power of two (so the bound changes seldom),
    within ``MIN_QUEUE``..``MAX_QUEUE``."""
    want = rate * QUEUE_SECONDS
    level = MIN_QUEUE
    while level * 2 <= min(want, MAX_QUEUE):
        level *= 2
    return level


@dataclass
class DrainRate:
    """The running estimate of a link's delivery rate, from the kernel's samples. A sample
    taken while we had too little queued to keep the link busy (app-limited) says only that
    the link is at least that fast: it may raise the estimate, never lower it (else a small
    queue would measure a slow link and stay small), and at most double it, as slow start
    does: a burst a token bucket or a switch buffer lets through at once is delivered far
    faster than the link's rate (the first samples of a 500 Mbit/s link in
    bench/linerate.py read 0.7-2.2 GB/s, and its queue stayed at 4 MiB for tens of
    milliseconds until the samples of a busy link pulled the estimate down). A busy link's
    samples are averaged (per-ACK samples are noisy)."""

    rate: float = 0.0

    def sample(self, rate: float, app_limited: bool) -> float:
        if rate <= 0:
            return self.rate
        if app_limited:
            if rate > self.rate:  # (from nothing measured: as if the least queue were full)
                self.rate = min(rate, 2 * self.rate or MIN_QUEUE / QUEUE_SECONDS)
            return self.rate
        self.rate = rate if self.rate == 0 else self.rate + RATE_WEIGHT * (rate - self.rate)
        return self.rate


def delivery_rate(sock: SocketLike) -> tuple[float, bool] | None:
    """The kernel's latest delivery-rate sample of ``sock`` (bytes a second, and whether it
    was app-limited); None where the platform has no such sample (not Linux, a kernel
    before 4.9, or a socket closing under us)."""
    info = tcp_info(sock, _INFO_LEN)
    if info is None:
        return None
    (rate,) = _DELIVERY.unpack_from(info, _DELIVERY_AT)
    return float(rate), bool(info[_APP_LIMITED_AT] & 1)


def limit_unsent(sock: SocketLike, nbytes: int) -> bool:
    """Let the kernel hold at most about ``nbytes`` of ``sock``'s data not yet sent
    (``TCP_NOTSENT_LOWAT``; in flight is not counted). Whether it could."""
    if _NOTSENT_LOWAT is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _NOTSENT_LOWAT, nbytes)
    except OSError:
        return False
    return True

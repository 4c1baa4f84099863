"""The bound a TCP connection keeps on what it has queued (io/send_queue.py): the level
for a link's pace, the running estimate of that pace, and the kernel's part (Linux)."""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct
from collections.abc import Iterator

import pytest

from tensorhub.io.send_queue import (
    MAX_QUEUE,
    MIN_QUEUE,
    QUEUE_SECONDS,
    DrainRate,
    delivery_rate,
    limit_unsent,
    queue_bytes,
)

SIOCOUTQNSD = 0x894B  # (Linux: bytes a socket holds not yet sent)


def test_the_level_is_the_links_pace_for_queue_seconds_in_powers_of_two() -> None:
    assert queue_bytes(0) == MIN_QUEUE  # not measured yet
    assert queue_bytes(1e3) == MIN_QUEUE
    assert queue_bytes(125e6) == 1 << 20  # 1 Gbit/s: 1.25 MB in 10 ms
    assert queue_bytes(62.5e6) == 512 << 10  # a half-rate link
    assert queue_bytes(4e9) == MAX_QUEUE  # loopback: what every connection kept before
    for rate in (1e6, 3e7, 1.1e8, 2.9e8, 7e8, 1e10):
        level = queue_bytes(rate)
        assert level & (level - 1) == 0 and MIN_QUEUE <= level <= MAX_QUEUE
        assert level <= max(MIN_QUEUE, rate * QUEUE_SECONDS) < 2 * level or level == MAX_QUEUE


def test_an_app_limited_sample_raises_the_estimate_at_most_twofold_and_never_lowers_it() -> None:
    """A sample taken while we queued too little to keep the link busy says only that the
    link is at least that fast; taken as the link's pace, a small queue would measure a
    slow link and stay small. A burst let through at once reads far faster than the link:
    it may double the estimate, as slow start does, no more."""
    d = DrainRate()
    assert d.sample(0.0, False) == 0.0  # (no sample yet: the kernel's first reads 0)
    first = MIN_QUEUE / QUEUE_SECONDS
    assert d.sample(2e9, True) == first  # a burst on a fresh connection: the least queue's
    assert queue_bytes(d.rate) == MIN_QUEUE
    assert d.sample(2e9, True) == 2 * first
    assert d.sample(1e6, True) == 2 * first  # (never lowered by an app-limited sample)
    assert d.sample(3 * first, True) == 3 * first
    for _ in range(8):  # a fast link's queue grows to the most in a few samples
        d.sample(4e9, True)
    assert queue_bytes(d.rate) == MAX_QUEUE
    busy = d.rate
    assert busy > d.sample(60e6, False) > 60e6  # a busy link's samples are averaged
    for _ in range(30):
        d.sample(62.5e6, False)
    assert queue_bytes(d.rate) == 512 << 10  # a 500 Mbit/s link's


@contextlib.contextmanager
def _pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ls = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(ls.getsockname())
    s, _ = ls.accept()
    ls.close()
    try:
        yield c, s
    finally:
        c.close()
        s.close()


def _fill(sock: socket.socket) -> int:
    """Send until the kernel takes no more; bytes taken."""
    sock.setblocking(False)
    sent, block = 0, b"x" * (1 << 20)
    with contextlib.suppress(BlockingIOError):
        for _ in range(256):
            sent += sock.send(block)
    return sent


def test_the_kernel_measures_a_links_delivery_rate() -> None:
    with _pair() as (c, s):
        if delivery_rate(c) is None:
            pytest.skip("this platform's tcp_info has no delivery rate (Linux >= 4.9 has)")
        sent = _fill(c)
        got = 0
        while got < sent:
            got += len(s.recv(1 << 20))
        sample = delivery_rate(c)
        assert sample is not None and sample[0] > 1e6  # (loopback: gigabytes a second)


def test_the_kernel_holds_no_more_unsent_than_it_is_let() -> None:
    """TCP_NOTSENT_LOWAT: a peer that reads nothing leaves at most about the bound unsent
    here (what is in flight to its receive buffer is not counted)."""
    with _pair() as (c, _s):
        if not limit_unsent(c, MIN_QUEUE):
            pytest.skip("this platform has no TCP_NOTSENT_LOWAT")
        _fill(c)
        (unsent,) = struct.unpack("i", fcntl.ioctl(c.fileno(), SIOCOUTQNSD, b"\0" * 4))
        assert unsent <= MIN_QUEUE + (256 << 10), unsent  # (the kernel takes whole skbs)
    with _pair() as (c, _s):  # without the bound: megabytes
        _fill(c)
        (unsent,) = struct.unpack("i", fcntl.ioctl(c.fileno(), SIOCOUTQNSD, b"\0" * 4))
        assert unsent > 2 * MIN_QUEUE, unsent

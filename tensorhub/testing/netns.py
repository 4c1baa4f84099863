"""Nodes with NICs of a chosen rate on one machine: Linux network namespaces, veth pairs, a
bridge and ``tc tbf``.

On loopback every byte costs the same CPU whoever sends it, so a fan-out benchmark there
measures CPU contention, not what replication does for a network. Here each node lives
in its own namespace behind a veth whose rate is limited both ways (``tbf`` on each end's
egress), all joined by a bridge in a namespace of its own; nothing touches the host's
namespace. :class:`Fabric` builds it and removes all of it on every exit path (an
exception, Ctrl-C, SIGTERM); :func:`enter` moves the calling process into a node's
namespace (a spawned child, before it opens a socket).

Needs root, ``ip`` and ``tc`` (iproute2); :func:`unavailable` says why not where they are
missing, and the benchmark exits with that reason.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import FrameType

CLONE_NEWNET = 0x40000000
PREFIX = "thb"  # every namespace and link this module creates starts with it
SUBNET = "10.77.0"


def unavailable() -> str | None:
    """Why namespaces cannot be built here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or skip --net netns)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' (iproute2) is not installed"
    return None


def _run(*cmd: str, ns: str | None = None, check: bool = True) -> None:
    full = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    subprocess.run(full, check=check, capture_output=True, text=True)


def enter(ns: str | None) -> None:
    """Move this process (its calling thread: call it before starting threads or opening
    sockets) into the network namespace ``ns``; None stays in this one (loopback:
    testing/loopback.py)."""
    if ns is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/var/run/netns/{ns}") as f:
        if libc.setns(f.fileno(), CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {ns}: {os.strerror(err)}")


GSO_MAX = 64 << 10
"""The largest packet a veth hands its qdisc (its ``gso_max_size``): TCP's segmentation
offload sends up to this much as one packet."""


def tbf_burst(mbit: float, mtu: int) -> int:
    """A NIC's token bucket, in bytes: a few MTUs and at least 1 ms of the rate (enough for
    line rate, too little to hide the limit), and never below two offloaded packets
    (``GSO_MAX``). A packet larger than the bucket is cut into MTU-sized ones in software
    (``tbf_segment``), on the sender's CPU: with a bucket of 1 ms of the rate that was every
    link under 525 Mbit/s, the half-rate NIC of ``bench/linerate.py --case slow`` and
    every 250 and 500 Mbit/s run. At 500 Mbit/s, N=8, 256 MiB the raw chain spent 3.0 CPU
    seconds per GB, 0.84 with this bucket, and tensorhub took 1.66x one copy, 1.056x with
    it (docs/results.md, session 42)."""
    return max(4 * mtu, int(mbit * 1e6 / 8 / 1000), 2 * GSO_MAX)


QUEUE_MS = 50.0
"""Each NIC's queue, in milliseconds of its rate: deep, as an edge router's (6 MB at 1
Gbit/s), where a data-centre switch port holds a few hundred microseconds. Every NIC-limited
figure on record was measured with it; TCP cubic fills it, so whatever rides
a connection behind bulk data (a relay's news of its chunks) waits up to this long
(bench/linerate.py ``--queue-ms``; docs/results.md, session 47)."""


@dataclass
class Fabric:
    """``nodes`` namespaces behind NICs of ``rate_mbit`` (both ways), on one bridge."""

    nodes: int
    rate_mbit: float
    mtu: int = 9000
    rates: dict[int, float] = field(default_factory=dict)
    """Nodes whose NIC runs at another rate than ``rate_mbit`` (a slow host), by index."""
    queue_ms: float = QUEUE_MS
    """How long a packet may wait in a NIC's queue (``tbf``'s ``latency``): the depth of
    its buffer, in time at its rate."""
    tag: str = field(default_factory=lambda: f"{os.getpid() % 10000}")
    _made: list[str] = field(default_factory=list)

    @property
    def bridge_ns(self) -> str:
        return f"{PREFIX}{self.tag}br"

    def ns(self, i: int) -> str:
        return f"{PREFIX}{self.tag}n{i}"

    def ip(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def __enter__(self) -> Fabric:
        old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}

        def cleanup_and_exit(signum: int, _frame: FrameType | None) -> None:
            self.close()
            raise SystemExit(128 + signum)

        for s in old:
            signal.signal(s, cleanup_and_exit)
        self._old_signals = old
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        for s, h in self._old_signals.items():
            signal.signal(s, h)

    def _build(self) -> None:
        br = self.bridge_ns
        _run("ip", "netns", "add", br)
        self._made.append(br)
        _run("ip", "link", "add", "br0", "type", "bridge", ns=br)
        _run("ip", "link", "set", "br0", "mtu", str(self.mtu), "up", ns=br)
        for i in range(self.nodes):
            mbit = self.rates.get(i, self.rate_mbit)
            rate = f"{mbit}mbit"
            burst = str(tbf_burst(mbit, self.mtu))
            ns, a, b = self.ns(i), f"{PREFIX}{self.tag}a{i}", f"{PREFIX}{self.tag}b{i}"
            _run("ip", "netns", "add", ns)
            self._made.append(ns)
            _run("ip", "link", "add", a, "type", "veth", "peer", "name", b, ns=br)
            _run("ip", "link", "set", a, "netns", ns, ns=br)
            _run("ip", "link", "set", b, "master", "br0", "mtu", str(self.mtu), "up", ns=br)
            _run("ip", "link", "set", a, "name", "eth0", ns=ns)
            _run("ip", "addr", "add", f"{self.ip(i)}/24", "dev", "eth0", ns=ns)
            _run("ip", "link", "set", "eth0", "mtu", str(self.mtu), "up", ns=ns)
            _run("ip", "link", "set", "lo", "up", ns=ns)
            for dev, where in (("eth0", ns), (b, br)):  # up at the node, down at the bridge
                _run(
                    "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                    "rate", rate, "burst", burst, "latency", f"{self.queue_ms:g}ms",
                    ns=where,
                )  # fmt: skip

    def congestion_control(self) -> str:
        """The TCP congestion control a socket in the nodes' namespaces gets when it sets
        none (gloo's): the host's default when the namespaces were made. A namespace may
        default only to one the host allows (``tcp_allowed_congestion_control``), so it
        cannot be set to another without widening the host's list; tensorhub's and the raw
        systems' sockets set theirs (``io.tcp.use_congestion_control``)."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.ns(0), "sysctl", "-n", "net.ipv4.tcp_congestion_control"],
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    def counters(self) -> list[tuple[int, int]]:
        """Bytes each node has sent and received so far, by node index, counted at the
        bridge's end of its veth (one ``ip`` call for all)."""
        out = subprocess.run(
            ["ip", "-n", self.bridge_ns, "-j", "-s", "link", "show"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        by_name = {link["ifname"]: link["stats64"] for link in json.loads(out)}
        got = []
        for i in range(self.nodes):
            st = by_name[f"{PREFIX}{self.tag}b{i}"]
            got.append((st["rx"]["bytes"], st["tx"]["bytes"]))  # the bridge hears what it sent
        return got

    def close(self) -> None:
        """Delete every namespace this fabric made (their links go with them)."""
        while self._made:
            ns = self._made.pop()
            _run("ip", "netns", "del", ns, check=False)


@contextlib.contextmanager
def inside(ns: str) -> Iterator[None]:
    """For tests of this module: run the body in ``ns`` (this thread), then come back."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/self/ns/net") as home:
        enter(ns)
        try:
            yield
        finally:
            libc.setns(home.fileno(), CLONE_NEWNET)

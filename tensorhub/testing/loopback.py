"""A :class:`~tensorhub.testing.netns.Fabric`'s node addresses on this host's loopback, for
the benchmarks' CPU measurements.

On loopback no NIC limits a node, so a fan-out there measures what the stack costs in CPU
(#17's loopback target: the swarm's CPU seconds per GB against a raw chain's, in the same
run), not what replication does for a network. Each node gets an address of its own in
127.0.0.0/8 (every one of them is this host's on Linux, with no setup), so the benchmarks
can give every node the same port as in the namespaces. Needs no root.
"""

from __future__ import annotations

SUBNET = "127.77.0"  # (out of the way of services bound to 127.0.0.1)


class Loopback:
    """Nodes on loopback: a :class:`Fabric`'s addresses and namespaces (none), without its
    NICs: no rates, no counters, nothing to build or remove."""

    def ns(self, i: int) -> None:
        """No namespace: every node stays in the host's."""
        return None

    def ip(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def __enter__(self) -> Loopback:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

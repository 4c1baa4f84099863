"""What the data plane asks of the cluster around it, as one delegate.

A node serving a chunk needs to know where the asker is (a rack-mate may queue longer; a
super-seeding origin redirects a remote asker to its own datacenter), and a node dialling
a peer needs to know whether UCX reaches it. The node itself knows none of this: gossip
does. The Hub hands the node one :class:`ClusterView` at construction; a bare node (tests,
benchmarks, the two-process demo) gets :class:`Unaware`, which knows nothing and so
chooses the plain answers: one queue limit for all, no redirects, TCP.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ..core.swarm.serve import NO_CONTEXT, SeedContext


class ClusterView(Protocol):
    def near(self, peer: str) -> bool:
        """Is ``peer`` in our rack (or on our host)? Its requests may queue longer here."""
        ...

    def seed_context(self, peer: str) -> SeedContext:
        """Where ``peer`` is, for a super-seeding origin's decision."""
        ...

    def ucx_route(self, addr: str) -> str | None:
        """The UCX address to dial for the peer at TCP ``addr``, or None for TCP."""
        ...


class Unaware:
    """Nothing known about the cluster."""

    def near(self, peer: str) -> bool:
        return False

    def seed_context(self, peer: str) -> SeedContext:
        return NO_CONTEXT

    def ucx_route(self, addr: str) -> str | None:
        return None


class Routes(Unaware):
    """Knows only which peers UCX reaches (TCP address → UCX address): for benchmarks and
    tests that start bare nodes."""

    def __init__(self, routes: Mapping[str, str]) -> None:
        self.routes = routes

    def ucx_route(self, addr: str) -> str | None:
        return self.routes.get(addr)

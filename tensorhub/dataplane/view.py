"""What the data plane asks of the cluster around it, as one delegate.

A node serving a chunk needs to know where the asker is (a rack-mate may queue longer; a
super-seeding origin redirects a remote asker to its own datacenter), and a node dialling
a peer needs to know whether UCX reaches it. A fetch needs the version's holders, and news
of them as it runs: holders appearing or growing, members turning suspect or dead, who in
our datacenter fetches it too. The node itself knows none of this: gossip does. The Hub
hands the node one :class:`ClusterView` at construction; a bare node (tests, benchmarks,
the two-process demo) gets :class:`Unaware`, which knows nothing and so chooses the plain
answers: one queue limit for all, no redirects, TCP, no holders but those the caller names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..core.gossip.membership import Status
from ..core.naming import ShardKey
from ..core.swarm.serve import NO_CONTEXT, SeedContext


@dataclass(frozen=True)
class Holder:
    """A source hint: its address, locality tier from us, and the chunks it says it has
    (None: all). Hints may be stale; correctness never depends on them."""

    addr: str
    tier: int = 2
    chunks: Iterable[int] | None = None
    origin: bool = False  # the publisher: asked last, it super-seeds
    lagging: bool = False  # a relay link that fell behind (see Holding.lagging)


@dataclass(frozen=True)
class SourceNews:
    """What changed about one version's sources, as the cluster view learnt it.

    ``holders``: holders whose advertisement is new or changed (each replaces what the
    fetch knew of it). ``dc_fetchers``/``dc_members``: when not None, our datacenter's
    fetchers of the version and its other live members, now (the WAN-owner candidates).
    ``health``: when not None, what gossip says now of each member with news, by address
    (a source declared dead is dropped; a suspect gets no new requests). ``gone``: holders
    whose advertisement was withdrawn (they unpublished, or a failed fetch let go): the
    fetch plans without them instead of asking them again every ``gone_ticks`` and being
    told "withdrawn" each time."""

    holders: list[Holder] = field(default_factory=list)
    dc_fetchers: list[str] | None = None
    dc_members: list[str] | None = None
    health: Mapping[str, Status] | None = None
    gone: list[str] = field(default_factory=list)


NO_NEWS = SourceNews()

Unwatch = Callable[[], None]


class ClusterView(Protocol):
    def near(self, peer: str) -> bool:
        """Is ``peer`` in our rack (or on our host)? Its requests may queue longer here."""
        ...

    def seed_context(self, peer: str) -> SeedContext:
        """Where ``peer`` is, for a super-seeding origin's decision."""
        ...

    def lagging(self, key: ShardKey, version: int, name: str) -> bool:
        """Does node ``name`` advertise its replica of (key, version) as a relay link that
        fell behind (Holding.lagging)?"""
        ...

    def lagged_before(self, key: ShardKey) -> frozenset[str]:
        """The members (us, perhaps) whose relay fell behind in their last fetch of
        ``key``, by address (their lag memory: ChunkPlanner.set_lagged_before). Read once,
        as a fetch begins."""
        ...

    def ucx_route(self, addr: str) -> str | None:
        """The UCX address to dial for the peer at TCP ``addr``, or None for TCP."""
        ...

    def sources(self, key: ShardKey, version: int) -> SourceNews:
        """Everything known now about (key, version)'s sources: a fetch's first news."""
        ...

    def watch_sources(
        self, key: ShardKey, version: int, tell: Callable[[SourceNews], None]
    ) -> Unwatch:
        """Call ``tell`` with each later change, until the returned function is called."""
        ...

    def locate(self, name: str) -> tuple[str, int] | None:
        """A node name → (its address, its locality tier from us), if known (redirects
        name nodes, not addresses)."""
        ...


class Unaware:
    """Nothing known about the cluster."""

    def sources(self, key: ShardKey, version: int) -> SourceNews:
        return NO_NEWS

    def watch_sources(
        self, key: ShardKey, version: int, tell: Callable[[SourceNews], None]
    ) -> Unwatch:
        return _nothing

    def locate(self, name: str) -> tuple[str, int] | None:
        return None

    def near(self, peer: str) -> bool:
        return False

    def seed_context(self, peer: str) -> SeedContext:
        return NO_CONTEXT

    def lagging(self, key: ShardKey, version: int, name: str) -> bool:
        return False

    def lagged_before(self, key: ShardKey) -> frozenset[str]:
        return frozenset()

    def ucx_route(self, addr: str) -> str | None:
        return None


class Routes(Unaware):
    """Knows only which peers UCX reaches (TCP address → UCX address): for benchmarks and
    tests that start bare nodes."""

    def __init__(self, routes: Mapping[str, str]) -> None:
        self.routes = routes

    def ucx_route(self, addr: str) -> str | None:
        return self.routes.get(addr)


def _nothing() -> None:
    pass

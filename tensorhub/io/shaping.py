"""WAN emulation on one machine: per datacenter pair, a bandwidth and a round-trip time.

Off unless configured (the launcher does it from a topology). A node's uploads to a node in
another datacenter pass a token bucket for that pair (the sender's share of the link), and
its requests to another datacenter leave one round trip late, so pipelined requests still
overlap as over a real long link. Bytes within a datacenter are never shaped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..core.shaping import TokenBucket


@dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes per second, this node's share
    rtt: float = 0.0  # seconds


class WanShaper:
    def __init__(
        self, my_dc: str, links: Mapping[str, Link], dc_of: Callable[[str], str | None]
    ) -> None:
        """``links``: remote datacenter → link from ours; ``dc_of``: node name → its DC."""
        self.my_dc = my_dc
        self.links = dict(links)
        self.dc_of = dc_of
        self._buckets = {
            dc: TokenBucket(link.bandwidth, max(link.bandwidth * 0.01, 1 << 20))
            for dc, link in self.links.items()
        }

    def _link(self, peer: str) -> tuple[str, Link] | None:
        dc = self.dc_of(peer)
        if dc is None or dc == self.my_dc:
            return None
        link = self.links.get(dc)
        return None if link is None else (dc, link)

    async def upload(self, peer: str, nbytes: int) -> None:
        """Wait until ``nbytes`` to ``peer`` may leave (bandwidth)."""
        found = self._link(peer)
        if found is not None:
            wait = self._buckets[found[0]].reserve(asyncio.get_running_loop().time(), nbytes)
            if wait > 0:
                await asyncio.sleep(wait)

    async def request(self, peer: str) -> None:
        """Wait one round trip before a request to ``peer`` leaves (latency)."""
        found = self._link(peer)
        if found is not None and found[1].rtt > 0:
            await asyncio.sleep(found[1].rtt)

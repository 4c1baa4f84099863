"""Routing for tests that start bare Nodes over UCX (what a Hub does from gossip)."""

from __future__ import annotations

from tensorhub.dataplane.node import Node
from tensorhub.dataplane.view import Routes

UCX_ADDRESSES: dict[str, str] = {}
"""TCP address → UCX address of every UCX node the tests started."""


def routed(*started: Node) -> None:
    """Let these nodes dial each other (and earlier ones) over UCX where they have it."""
    for node in started:
        if node.ucx_address is not None:
            UCX_ADDRESSES[node.address] = node.ucx_address
            node.view = Routes(UCX_ADDRESSES)

"""Gossip: SWIM membership with Lifeguard, Scuttlebutt state, and the holder view.

Pure and deterministic like every core: time is counted in ticks, randomness is injected,
messages go out through an outbox the driver (or the simulator) drains.
"""

from .core import GossipConfig, GossipCore
from .holders import HolderView, tier
from .membership import Status

__all__ = ["GossipConfig", "GossipCore", "HolderView", "Status", "tier"]

"""How a model's shards are named inside the system, and how users see them.

The data plane keys everything by ``model@shard`` (one manifest, one holder view per
shard); users named a model and, where they shard it, a shard number. Every message a user
reads goes through :func:`display_name`, so "policy@0" never leaks out.
"""

from __future__ import annotations


def display_name(dp: str) -> str:
    """A model's name as users wrote it: "policy", or "policy (shard 2)"; never "policy@0"."""
    model, sep, shard = dp.rpartition("@")
    if not sep or not shard.isdigit():
        return dp
    return model if shard == "0" else f"{model} (shard {shard})"

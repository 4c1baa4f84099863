"""How a model's shards are named inside the system, and how users see them.

The data plane keys everything by ``model@shard`` (one manifest, one holder view per
shard); users named a model and, where they shard it, a shard number. Every message a user
reads goes through :func:`display_name`, so "policy@0" never leaks out.
"""

from __future__ import annotations

from typing import TypeAlias

ShardKey: TypeAlias = str
"""What the data plane keys a manifest, its replicas and its holders by: ``model@shard``
from the Hub (any string for a bare node). A parameter holding one is named ``key``, never
``model``: the registry's ``model`` is the name a user gave."""


def display_name(dp: ShardKey) -> str:
    """A model's name as users wrote it: "policy", or "policy (shard 2)"; never "policy@0"."""
    model, shard = split_key(dp)
    return model if shard == 0 else f"{model} (shard {shard})"


def shard_key(model: str, shard: int) -> ShardKey:
    """The data-plane key of one shard of a model."""
    return f"{model}@{shard}"


def split_key(key: ShardKey) -> tuple[str, int]:
    """(model, shard) of a data-plane key (the inverse of :func:`shard_key`); a bare
    node's key without a shard is shard 0 of itself."""
    model, sep, shard = key.rpartition("@")
    return (model, int(shard)) if sep and shard.isdigit() else (key, 0)

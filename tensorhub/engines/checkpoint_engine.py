"""A verl-style checkpoint engine backed by tensorhub.

verl moves weights from trainer to rollout through a ``CheckpointEngine``
(``verl/checkpoint_engine/base.py``): ``prepare`` → ``build_topology`` →
``init_process_group`` → ``send_weights(generator)`` on the trainer and
``receive_weights()`` (a generator of ``(name, tensor)``) on each rollout worker →
``finalize``. Its NCCL backend rebuilds a process group whenever a replica joins or leaves;
this one has no group to build: the trainer publishes a version, every rollout streams it
from the nearest holders, and replicas come and go freely.

The class has the methods verl calls and imports nothing from verl; register it there with
``CheckpointEngineRegistry.register("tensorhub")(TensorHubCheckpointEngine)``.

The trainer side needs the whole version at once (a version is committed as one manifest):
``send_weights`` copies each tensor the generator yields to host memory (what tensorhub
serves from), publishes, and lets go of the previous version. The rollout side holds one
bucket at a time (``bucket_size``), as verl's own engines do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterable, Iterator
from typing import Any

import torch

from ..hub import SyncHub


class TensorHubCheckpointEngine:
    """``seeds``/``secret``: the tensorhub cluster (its voters); ``model``: the name versions
    are published under; ``is_master``: the trainer rank that publishes (others send
    nothing: with FSDP every rank sees the full tensors, one copy is enough)."""

    def __init__(
        self,
        bucket_size: int,
        *,
        seeds: list[str],
        secret: str,
        model: str = "policy",
        locality: str = "dc0/rack0",
        is_master: bool = True,
        name: str | None = None,
    ) -> None:
        self.bucket_size = bucket_size
        self.seeds, self.secret, self.model = seeds, secret, model
        self.locality, self.is_master, self.name = locality, is_master, name
        self.rank = 0
        self.version = 0
        """The last version sent (trainer) or received (rollout)."""
        self._hub: SyncHub | None = None

    def _started(self) -> SyncHub:
        if self._hub is None:
            name = self.name or f"ckpt-{id(self):x}"
            self._hub = SyncHub(
                name=name, locality=f"{self.locality}/{name}", seeds=self.seeds, secret=self.secret
            )
        return self._hub

    def prepare(self) -> dict[str, Any]:
        """Join the cluster (once); the metadata verl gathers: this node's address."""
        return {"address": self._started().address}

    @classmethod
    def build_topology(
        cls, trainer_world_size: int, rollout_world_size: int, metadata: list[dict[str, Any]]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """No process group: each worker only learns its rank."""
        return (
            {"rank": list(range(trainer_world_size))},
            {"rank": list(range(rollout_world_size))},
        )

    def init_process_group(self, rank: int = 0, **_: Any) -> None:
        self.rank = rank

    def finalize(self) -> None:
        """Nothing to tear down between steps (the Hub stays, serving what it holds)."""

    async def send_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Publish the next version from ``weights`` (on the master rank; others drain)."""
        if not (self.is_master and self.rank == 0):
            for _ in weights:  # every trainer rank runs the generator (FSDP gathers in it)
                pass
            return
        tensors = {n: t.detach().to("cpu", copy=True) for n, t in weights}
        hub = self._started()
        version = max(self.version, await asyncio.to_thread(hub.latest, self.model)) + 1
        await asyncio.to_thread(hub.publish, self.model, version, tensors)
        if self.version:
            await asyncio.to_thread(hub.unpublish, self.model, self.version)
        self.version = version

    async def receive_weights(self) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """The latest version, tensor by tensor, one bucket in memory at a time (each
        tensor is valid until the next bucket: copy it, as ``load_weights`` does)."""
        hub = self._started()
        version = await asyncio.to_thread(hub.latest, self.model)
        buckets: Iterator[list[tuple[str, torch.Tensor]]] = hub.stream(
            self.model, version, bucket_bytes=self.bucket_size
        )
        try:
            while (bucket := await asyncio.to_thread(next, buckets, None)) is not None:
                for pair in bucket:
                    yield pair
        finally:
            close = getattr(buckets, "close", None)
            if close is not None:
                await asyncio.to_thread(close)
        self.version = version

    def close(self) -> None:
        if self._hub is not None:
            self._hub.close()
            self._hub = None

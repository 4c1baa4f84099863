"""vLLM: a worker extension that loads versions from tensorhub, and Llama-family layouts.

Two ways in, both through vLLM's own worker processes (``worker_extension_cls``, called on
every tensor-parallel rank with ``LLM.collective_rpc``):

- ``tensorhub_load``: stream the version (HF names, as the trainer published them) into
  ``model.load_weights``, bucket by bucket. vLLM's loaders fuse q/k/v and gate/up and take
  each rank's share themselves; memory is one bucket; every rank moves the whole model.
- ``tensorhub_load_shard``: the trainer published with :func:`llama_transforms` (fused,
  rank-major for ``world`` ranks); each rank fetches only its share straight into its
  parameters (:meth:`Hub.fetch_slices`), about 1/world of the model per rank.

Both block generation on that worker while they run (vLLM pauses scheduling around
``collective_rpc``); ``tensorhub_version`` answers which version the weights hold.

    llm = LLM(model=..., worker_extension_cls="tensorhub.engines.vllm.TensorHubWorker",
              tensor_parallel_size=2)
    llm.collective_rpc("tensorhub_join", args=(seeds, secret, "dc0/rack1"))
    llm.collective_rpc("tensorhub_load", args=("policy", version))

The module imports nothing from vLLM: the extension only uses what vLLM gives a worker
(``self.model_runner.model``, ``self.rank``), so the layouts below are tested without it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from ..core.buckets import DEFAULT_BUCKET_BYTES
from ..core.manifest import Manifest
from ..hub import SyncHub
from ..reads import TensorSlice, tensor_parallel
from ..transforms import Fuse, ShardMajor, Transform

COLUMN_PARALLEL = r"(qkv_proj|gate_up_proj|embed_tokens|lm_head)\.weight$"
"""vLLM's Llama parameters split on dimension 0 across tensor-parallel ranks."""
ROW_PARALLEL = r"(o_proj|down_proj)\.weight$"
"""... and those split on dimension 1."""


def llama_transforms(world: int) -> list[Transform]:
    """Publish an HF Llama/Qwen/Mistral state_dict in vLLM's tensor-parallel layout for
    ``world`` ranks: q/k/v and gate/up fused rank by rank, as ``QKVParallelLinear`` and
    ``MergedColumnParallelLinear`` hold them, and the row-parallel weights rank-major, so
    every rank's share is contiguous. Only a reader with TP size ``world`` can use it: for
    half as many ranks the fused blocks would regroup as [q0 k0 v0 q1 k1 v1], not vLLM's
    [q0 q1 k0 k1 v0 v1]."""
    return [
        Fuse(("q_proj", "k_proj", "v_proj"), "qkv_proj", world=world),
        Fuse(("gate_proj", "up_proj"), "gate_up_proj", world=world),
        ShardMajor(ROW_PARALLEL, dim=1, world=world),
    ]


def tp_slices(
    manifest: Manifest, rank: int, world: int, names: Mapping[str, Any] | None = None
) -> dict[str, TensorSlice]:
    """Rank ``rank`` of ``world``'s slices of a version published with
    :func:`llama_transforms` (only of ``names``, if given: a rank's parameters)."""
    dims = {}
    for spec in manifest.tensors:
        if names is not None and spec.name not in names:
            continue
        if re.search(COLUMN_PARALLEL, spec.name):
            dims[spec.name] = 0
        elif re.search(ROW_PARALLEL, spec.name):
            dims[spec.name] = 1
    return tensor_parallel(manifest, rank, world, dims)


class TensorHubWorker:
    """Mixed into vLLM's worker class by ``worker_extension_cls``: ``self`` is the worker."""

    model_runner: Any
    rank: int
    _tensorhub: SyncHub | None = None
    tensorhub_loaded: tuple[str, int] | None = None

    def tensorhub_join(self, seeds: list[str], secret: str, locality: str) -> str:
        """Start this worker's Hub (a rollout node: not a voter); returns its address."""
        if self._tensorhub is None:
            self._tensorhub = SyncHub(
                name=f"vllm-{locality.replace('/', '-')}-rank{self.rank}",
                locality=f"{locality}/rank{self.rank}",
                seeds=seeds,
                secret=secret,
            )
        return self._tensorhub.address

    def _hub(self) -> SyncHub:
        if self._tensorhub is None:
            raise RuntimeError("call tensorhub_join on every worker first")
        return self._tensorhub

    def tensorhub_load(
        self, model: str, version: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> int:
        """Stream ``version`` (HF names) into ``load_weights``, one bucket at a time."""
        runner_model = self.model_runner.model
        for bucket in self._hub().stream(model, version, bucket_bytes=bucket_bytes):
            runner_model.load_weights(weights=bucket)
        self.tensorhub_loaded = (model, version)
        return version

    def tensorhub_load_shard(self, model: str, version: int, world: int | None = None) -> int:
        """Fetch this rank's share of ``version`` (published with
        :func:`llama_transforms` for ``world`` ranks; vLLM's tensor-parallel size if not
        given) straight into its parameters; returns bytes moved."""
        hub = self._hub()
        params = dict(self.model_runner.model.named_parameters())
        manifest = hub.manifest(model, version)
        into = {n: p.data for n, p in params.items() if n in {t.name for t in manifest.tensors}}
        rank, world = self._tp_rank(world)
        slices = tp_slices(manifest, rank, world, into)
        with torch.no_grad():
            res = hub.fetch_slices(model, version, into, slices)
        self.tensorhub_loaded = (model, version)
        return res.bytes

    def _tp_rank(self, world: int | None) -> tuple[int, int]:
        """This worker's tensor-parallel rank and size, from vLLM's parallel state rather
        than from ``self.rank`` (the global rank; modulo the TP size it is the TP rank only
        in vLLM's TP-innermost layout). Outside vLLM the global rank modulo ``world``
        stands in."""
        try:
            from vllm.distributed import (  # type: ignore[import-not-found]
                get_tensor_model_parallel_rank,
                get_tensor_model_parallel_world_size,
            )

            rank, size = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
        except (ImportError, AssertionError):  # no vLLM, or its groups are not set up
            if world is None:
                raise ValueError("pass world: vLLM's tensor-parallel size is unknown") from None
            return self.rank % world, world
        if world not in (None, size):
            raise ValueError(f"a share of {world} ranks asked for; this vLLM runs TP-{size}")
        return rank, size

    def tensorhub_version(self) -> tuple[str, int] | None:
        return self.tensorhub_loaded

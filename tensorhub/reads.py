"""Partial reads of a committed version: bounded-memory streams and row slices.

:meth:`Hub.fetch <tensorhub.Hub.fetch>` lands a whole version in tensors shaped exactly
like it. Engines often cannot offer that: vLLM and SGLang keep fused, sharded parameters
and load through ``load_weights(iterable of (name, tensor))``, and a tensor-parallel rank
wants its rows, not the model. These reads swarm only the chunks they need, every chunk
verified against the committed manifest as in a full fetch, into one buffer of their own:

- :func:`stream` yields the version bucket by bucket (a list of ``(name, tensor)`` whose
  tensors are views of one reused buffer), so memory stays at one bucket, not a model;
- :func:`fetch_slices` lands rows of some tensors (and whole others) in the caller's
  tensors, moving about those bytes (whole chunks, sliced here: see docs/engines.md).

A partial read does not make this node a holder: its bytes are reused or a fraction of
the version, so it serves nothing onward (a full :meth:`~tensorhub.Hub.fetch` does).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from .core.buckets import (
    DEFAULT_BUCKET_BYTES,
    RowSlice,
    bucket_capacity,
    chunks_for,
    plan_buckets,
    slice_range,
)
from .core.errors import ManifestError
from .core.layout import TensorSpec
from .core.manifest import Manifest
from .core.naming import shard_key
from .dataplane.fetch import FetchResult
from .dataplane.store import Replica
from .io.chunk_buffer import ChunkBuffer
from .io.tensors import torch_dtype
from .transforms import logical

if TYPE_CHECKING:
    from .hub import Hub

Bucket = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class TensorSlice:
    """Rows [start, stop) of a tensor's dimension ``dim``. Dimension 0 is contiguous in
    the flat layout, so only its chunks move; any other dimension moves the whole tensor
    (its rows interleave), then is sliced here."""

    dim: int
    start: int
    stop: int


def tensor_parallel(
    manifest: Manifest, rank: int, world: int, dims: Mapping[str, int]
) -> dict[str, TensorSlice]:
    """Rank ``rank`` of ``world``'s even shares: ``dims`` maps each sharded tensor's name
    to the dimension it is split on (0: column-parallel/vocab-parallel, 1: row-parallel);
    tensors not named are replicated (read whole)."""
    specs = {t.name: t for t in manifest.tensors}
    out: dict[str, TensorSlice] = {}
    for name, dim in dims.items():
        spec = specs.get(name)
        if spec is None:
            raise ManifestError(f"{name!r} is not in the version")
        shape = manifest.logical_shape(spec)
        if not 0 <= dim < len(shape):
            raise ManifestError(f"{name!r} of shape {shape} has no dimension {dim}")
        size = shape[dim]
        if size % world:
            raise ManifestError(f"{name!r}: {size} along dim {dim} does not split over {world}")
        per = size // world
        out[name] = TensorSlice(dim, rank * per, (rank + 1) * per)
    return out


def sliced_shape(shape: tuple[int, ...], s: TensorSlice | None) -> tuple[int, ...]:
    if s is None:
        return shape
    out = list(shape)
    out[s.dim] = s.stop - s.start
    return tuple(out)


@dataclass(frozen=True)
class Read:
    """How one destination is read: flat bytes [start, end), viewed as ``shape`` (the
    published rows read), then put back to logical order along ``undo`` if the tensor was
    published rank-major, then narrowed by ``narrow`` (a slice not on whole chunks' rows)."""

    start: int
    end: int
    dtype: str
    shape: tuple[int, ...]
    undo: int | None = None
    narrow: TensorSlice | None = None

    def tensor(self, data: ChunkBuffer) -> torch.Tensor:
        t = data.gather(self.start, self.end).view(torch_dtype(self.dtype)).view(self.shape)
        if self.undo is not None:
            t = logical(t, self.undo)
        if self.narrow is not None:
            t = t.narrow(self.narrow.dim, self.narrow.start, self.narrow.stop - self.narrow.start)
        return t


def plan_read(manifest: Manifest, spec: TensorSpec, s: TensorSlice | None) -> Read:
    """The fewest bytes that give slice ``s`` of ``spec`` (the whole tensor if None):
    rows of dimension 0; whole rank blocks of a rank-major tensor split on ``s.dim``;
    else the whole tensor, narrowed here."""
    whole = (spec.offset, spec.offset + spec.nbytes)
    sm = manifest.shard_major(spec.name)
    if sm is not None:
        blk = manifest.logical_shape(spec)[sm.dim] // spec.shape[0]
        if s is not None and s.dim == sm.dim and s.start % blk == 0 and s.stop % blk == 0:
            rows = RowSlice(s.start // blk, s.stop // blk)
            shape = (rows.stop - rows.start, *spec.shape[1:])
            return Read(*slice_range(spec, rows), spec.dtype, shape, sm.dim)
        return Read(*whole, spec.dtype, spec.shape, sm.dim, s)
    if s is not None and s.dim == 0:
        start, end = slice_range(spec, RowSlice(s.start, s.stop))
        return Read(start, end, spec.dtype, sliced_shape(spec.shape, s))
    return Read(*whole, spec.dtype, spec.shape, None, s)


async def fill(
    hub: Hub,
    manifest: Manifest,
    model: str,
    version: int,
    shard: int,
    data: ChunkBuffer,
    held: set[int],
    timeout: float,
) -> FetchResult:
    """Swarm the chunks of ``data`` not in ``held`` (a partial replica, not served)."""
    have = bytearray(b"\1" * manifest.num_chunks)
    for c in data.chunks:
        have[c] = c in held
    replica = Replica(shard_key(model, shard), version, manifest, data, have)
    if replica.complete:
        return FetchResult(replica.key, version, manifest, 0, 0, 0.0, 0.0)
    return await hub._fill_partial(replica, timeout)


async def stream(
    hub: Hub,
    model: str,
    version: int,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    shard: int = 0,
    timeout: float = 60.0,
) -> AsyncGenerator[Bucket, None]:
    """The version, bucket by bucket: each a list of ``(name, tensor)`` in layout order
    (an alias right after the tensor it shares), yielded once all its chunks verified.

    The tensors are views of one buffer that the next bucket reuses: consume (copy) them
    before asking for the next bucket, or ``.clone()`` what you keep. Peak memory is that
    buffer: ``bucket_bytes``, or the largest tensor's chunks if that is larger.
    ``timeout``: seconds for each bucket."""
    manifest = await hub.manifest(model, version, shard=shard, timeout=timeout)
    layout = manifest.layout
    buckets = plan_buckets(layout, bucket_bytes)
    buffer = torch.empty(bucket_capacity(buckets, layout.chunk_size), dtype=torch.uint8)
    prev: ChunkBuffer | None = None
    for b in buckets:
        data = ChunkBuffer(layout, b.chunks, buffer)
        held: set[int] = set()
        if prev is not None and prev.chunks and prev.chunks[-1] == b.first:
            prev.move(b.first, 0)  # the boundary chunk, verified already: no second fetch
            held.add(b.first)
        res = await fill(hub, manifest, model, version, shard, data, held, timeout)
        hub.fetch_totals["partial_bytes"] += res.bytes
        specs = [layout.tensors[i] for i in b.tensors]
        # As readers know each tensor: a rank-major one put back (a copy), others viewed.
        yield [(spec.name, plan_read(manifest, spec, None).tensor(data)) for spec in specs]
        prev = data


def _plan_reads(
    manifest: Manifest, into: Mapping[str, torch.Tensor], slices: Mapping[str, TensorSlice]
) -> dict[str, Read]:
    """How to read each destination; checks every name, dtype and shape first."""
    specs = {t.name: t for t in manifest.tensors}
    extra = [n for n in slices if n not in into]
    if extra:
        raise ManifestError(f"slices for tensors not in the destination: {extra[:5]}")
    reads: dict[str, Read] = {}
    for name, dest in into.items():
        spec = specs.get(name)
        if spec is None:
            raise ManifestError(f"{name!r} is not in the version")
        s = slices.get(name)
        want = sliced_shape(manifest.logical_shape(spec), s)
        if dest.dtype != torch_dtype(spec.dtype) or tuple(dest.shape) != want:
            raise ManifestError(
                f"destination {name!r} is {dest.dtype} {tuple(dest.shape)}, the read gives "
                f"{spec.dtype} {want}"
            )
        target = specs[spec.alias_of] if spec.alias_of is not None else spec
        reads[name] = plan_read(manifest, target, s)
    return reads


async def fetch_slices(
    hub: Hub,
    model: str,
    version: int,
    into: Mapping[str, torch.Tensor],
    slices: Mapping[str, TensorSlice],
    *,
    shard: int = 0,
    timeout: float = 60.0,
) -> FetchResult:
    """Fetch into ``into`` (any subset of the version's names): ``slices[name]`` of a
    sliced tensor, the whole of every other one; the destinations have the sliced shapes.
    Only the chunks holding those bytes move, each verified."""
    t0 = time.perf_counter()
    manifest = await hub.manifest(model, version, shard=shard, timeout=timeout)
    plan = _plan_reads(manifest, into, slices)
    ranges = {name: (r.start, r.end) for name, r in plan.items()}
    data = ChunkBuffer(manifest.layout, chunks_for(ranges, manifest.layout.chunk_size))
    res = await fill(hub, manifest, model, version, shard, data, set(), timeout)
    for name, dest in into.items():
        dest.copy_(plan[name].tensor(data))
    hub.fetch_totals["partial_bytes"] += res.bytes
    return replace(res, seconds=time.perf_counter() - t0)


__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "Bucket",
    "TensorSlice",
    "fetch_slices",
    "sliced_shape",
    "stream",
    "tensor_parallel",
]

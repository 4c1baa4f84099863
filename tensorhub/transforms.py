"""Publish-time transforms: publish what the readers load, not what the trainer holds.

A trainer keeps fp32 masters, HF names and separate q/k/v; its rollouts want bf16 or fp8,
an engine's names, fused ``qkv_proj`` and — for tensor parallelism — each rank's share
contiguous. Converting on every reader multiplies the work and the bytes; converting once
at publish moves the converted bytes only. Each transform here is declared, runs on the
publisher (copies: the trainer may step at once), and is recorded in the manifest
(:class:`~tensorhub.core.manifest.Applied`), which the registry commits with the root, so
every reader can see what it loads and undo a layout.

- :class:`Rename`: a mapping or a function of the name.
- :class:`Cast`: floating tensors to a dtype (fp32 masters → bf16).
- :class:`Fp8`: bf16/fp32 → ``float8_e4m3fn`` with a per-tensor ``<name>_scale`` (vLLM's
  per-tensor FP8 checkpoints) or a blockwise ``<name>_scale_inv`` (DeepSeek-V3 style
  128x128 blocks, which vLLM and SGLang load), dequantised as ``fp8 * scale``.
- :class:`Fuse`: siblings concatenated (``q_proj``/``k_proj``/``v_proj`` → ``qkv_proj``,
  ``gate_proj``/``up_proj`` → ``gate_up_proj``), as vLLM's stacked parameters are.
- :class:`ShardMajor`: a tensor split on dimension ``dim`` over ``world`` ranks is laid
  out rank by rank (``[world, ...]``), so a rank's share of a row-parallel weight (split on
  dimension 1, interleaved in every row otherwise) is contiguous: a tensor-parallel reader
  moves its share only, for any world that divides ``world``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from .core.errors import ManifestError
from .core.manifest import Applied
from .io.tensors import dtype_name

Tensors = dict[str, torch.Tensor]
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn


def _matches(pattern: str, name: str) -> bool:
    return re.search(pattern, name) is not None


@dataclass(frozen=True)
class Rename:
    """New names: ``mapping`` (names it lacks are kept) or a function of the name."""

    mapping: Mapping[str, str] | Callable[[str], str]

    def apply(self, tensors: Tensors) -> tuple[Tensors, list[Applied]]:
        m = self.mapping
        rename: Callable[[str], str] = m if callable(m) else (lambda n: m.get(n, n))
        out: Tensors = {}
        records = []
        for name, t in tensors.items():
            new = rename(name)
            if new in out:
                raise ManifestError(f"rename: {name!r} and another tensor both become {new!r}")
            out[new] = t
            if new != name:
                records.append(Applied("rename", new, (name,)))
        return out, records


@dataclass(frozen=True)
class Cast:
    """Floating tensors whose name matches ``names`` (a regex) to ``dtype``."""

    dtype: torch.dtype
    names: str = ""

    def apply(self, tensors: Tensors) -> tuple[Tensors, list[Applied]]:
        out: Tensors = {}
        records = []
        done: dict[int, torch.Tensor] = {}  # a tie stays a tie
        for name, t in tensors.items():
            if t.is_floating_point() and t.dtype != self.dtype and _matches(self.names, name):
                key = id(t)
                if key not in done:
                    done[key] = t.detach().to(self.dtype, copy=True)
                out[name] = done[key]
                records.append(Applied("cast", name, (name,), dtype_name(t.dtype)))
            else:
                out[name] = t
        return out, records


def _scale_name(name: str, blockwise: bool) -> str:
    return f"{name}_scale_inv" if blockwise else f"{name}_scale"


def quantize_fp8(
    t: torch.Tensor, block: tuple[int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` as float8_e4m3fn and its float32 scale (per tensor, or one per ``block`` of a
    2-D tensor), such that ``fp8.float() * scale`` (each block by its own) approximates
    ``t``: the largest magnitude of each block maps to e4m3's largest finite value."""
    x = t.detach().float()
    if block is None:
        scale = (x.abs().amax() / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
        return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale.reshape(())
    if x.dim() != 2:
        raise ManifestError(f"blockwise fp8 needs a 2-D tensor, not {tuple(x.shape)}")
    br, bc = block
    rows, cols = x.shape
    nr, nc = -(-rows // br), -(-cols // bc)
    padded = torch.zeros(nr * br, nc * bc)
    padded[:rows, :cols] = x
    blocks = padded.view(nr, br, nc, bc)
    scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    return q.view(nr * br, nc * bc)[:rows, :cols].contiguous().to(FP8), scale


def dequantize_fp8(
    q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None = None
) -> torch.Tensor:
    """Back to float32 (what a reader's check or a CPU engine does)."""
    if block is None:
        return q.float() * scale
    br, bc = block
    full = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)
    return q.float() * full[: q.shape[0], : q.shape[1]]


@dataclass(frozen=True)
class Fp8:
    """Floating tensors of 2+ dimensions whose name matches ``names`` to float8_e4m3fn,
    each with its scale published beside it (``block``: blockwise, e.g. (128, 128))."""

    names: str = r"\.weight$"
    block: tuple[int, int] | None = None

    def apply(self, tensors: Tensors) -> tuple[Tensors, list[Applied]]:
        out: Tensors = {}
        records = []
        parts = tuple(self.block or ())
        for name, t in tensors.items():
            if not (t.is_floating_point() and t.dim() >= 2 and _matches(self.names, name)):
                out[name] = t
                continue
            q, scale = quantize_fp8(t, self.block)
            sname = _scale_name(name, self.block is not None)
            if sname in tensors:
                raise ManifestError(f"fp8: {sname!r} exists already; cannot publish the scale")
            out[name], out[sname] = q, scale
            was = dtype_name(t.dtype)
            records += [Applied("fp8", name, (name,), was, 0, parts)]
            records += [Applied("fp8", sname, (name,), was, 0, parts)]
        return out, records


@dataclass(frozen=True)
class Fuse:
    """Every group of siblings ``parts`` (path components, e.g. ``q_proj``) concatenated
    along ``dim`` into one tensor named with ``into`` in their place.

    ``world`` > 1 lays the fused tensor out rank by rank, as a tensor-parallel engine holds
    it: rank r's rows are ``[q_r; k_r; v_r]`` (each part split evenly), which is what
    vLLM's ``QKVParallelLinear`` and ``MergedColumnParallelLinear`` keep on rank r. A
    rank then reads rows ``r`` of ``world`` of the fused tensor, contiguous."""

    parts: tuple[str, ...]
    into: str
    dim: int = 0
    world: int = 1

    def apply(self, tensors: Tensors) -> tuple[Tensors, list[Applied]]:
        first = f".{self.parts[0]}."
        out: Tensors = {}
        records = []
        used: set[str] = set()
        for name in tensors:
            if first not in f".{name}.":
                continue
            head, _, tail = f".{name}.".partition(first)
            sources = [f"{head}.{p}.{tail}".strip(".") for p in self.parts]
            missing = [s for s in sources if s not in tensors]
            if missing:
                raise ManifestError(f"fuse {self.parts} -> {self.into}: {missing} missing")
            target = f"{head}.{self.into}.{tail}".strip(".")
            ts = [tensors[s].detach() for s in sources]
            out[target] = self._fuse(target, ts)
            sizes = tuple(t.shape[self.dim] for t in ts)
            records.append(Applied("fuse", target, tuple(sources), "", self.dim, sizes, self.world))
            used.update(sources)
        for name, t in tensors.items():  # the rest keep their place
            if name not in used:
                out.setdefault(name, t)
        return out, records

    def _fuse(self, target: str, ts: list[torch.Tensor]) -> torch.Tensor:
        if self.world == 1:
            return torch.cat(ts, dim=self.dim)
        if any(t.shape[self.dim] % self.world for t in ts):
            sizes = [t.shape[self.dim] for t in ts]
            raise ManifestError(f"fuse {target!r}: parts {sizes} do not split over {self.world}")
        per_rank = [t.chunk(self.world, dim=self.dim) for t in ts]
        return torch.cat([p[r] for r in range(self.world) for p in per_rank], dim=self.dim)


@dataclass(frozen=True)
class ShardMajor:
    """Tensors whose name matches ``names``, split on ``dim`` (> 0) over ``world`` ranks,
    laid out rank-major: ``[world, *shape with shape[dim] // world]``. The manifest records
    it; :meth:`Hub.stream` and :meth:`Hub.fetch_slices` give readers the logical tensor."""

    names: str
    dim: int
    world: int

    def apply(self, tensors: Tensors) -> tuple[Tensors, list[Applied]]:
        out: Tensors = {}
        records = []
        for name, t in tensors.items():
            if not _matches(self.names, name) or t.dim() <= self.dim:
                out[name] = t
                continue
            if self.dim < 1 or t.shape[self.dim] % self.world:
                raise ManifestError(
                    f"shard_major {name!r}: dim {self.dim} of {tuple(t.shape)} does not "
                    f"split over {self.world} ranks (dim 0 is contiguous already)"
                )
            out[name] = rank_major(t, self.dim, self.world)
            records.append(Applied("shard_major", name, (name,), "", self.dim, (self.world,)))
        return out, records


def rank_major(t: torch.Tensor, dim: int, world: int) -> torch.Tensor:
    """``t`` split in ``world`` blocks along ``dim``, the blocks stacked first (a copy)."""
    blk = t.shape[dim] // world
    shape = (*t.shape[:dim], world, blk, *t.shape[dim + 1 :])
    return t.detach().reshape(shape).movedim(dim, 0).contiguous()


def logical(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Undo :func:`rank_major` on ``t`` (``[blocks, ...]``): the blocks back along ``dim``
    (a copy, since they interleave)."""
    return t.movedim(0, dim).flatten(dim, dim + 1)


Transform = Rename | Cast | Fp8 | Fuse | ShardMajor


def apply(
    tensors: Mapping[str, torch.Tensor], transforms: Sequence[Transform]
) -> tuple[Tensors, list[Applied]]:
    """Run ``transforms`` in order; the tensors to publish and the records for the
    manifest. A record follows its tensor: renamed with it, or onto the fused tensor a
    fuse made of it, so every record names a published tensor."""
    out = dict(tensors)
    records: list[Applied] = []
    for tr in transforms:
        out, new = tr.apply(out)
        moved = {src: a.name for a in new if a.kind in ("rename", "fuse") for src in a.sources}
        records = [r if r.name not in moved else _renamed(r, moved[r.name]) for r in records]
        records += new
    return out, records


def _renamed(r: Applied, name: str) -> Applied:
    return Applied(r.kind, name, r.sources, r.dtype, r.dim, r.parts, r.world)

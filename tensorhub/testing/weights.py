"""Model-shaped state_dicts of a chosen size, deterministic from a seed (benchmarks, tests)."""

from __future__ import annotations

import torch


def llm_like_state_dict(total: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """About ``total`` bytes shaped like an LLM's weights: a few big matrices in bf16, fp32
    and fp16, many small fp32 norms and an int64 step buffer — so packing, alignment and
    scatter into many tensors are exercised, not one flat blob."""
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {"step": torch.tensor(seed, dtype=torch.int64)}
    small = 8
    for i in range(64):
        sd[f"layers.{i}.norm.weight"] = torch.randn(1024, generator=g)
        small += 4096
    big = max(total - small, 0)
    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.bfloat16)
    per = big // len(dtypes)
    for i, dt in enumerate(dtypes):
        nbytes = per if i < len(dtypes) - 1 else big - per * (len(dtypes) - 1)
        elems = nbytes // dt.itemsize
        sd[f"layers.{i}.mlp.weight"] = torch.randn(elems, generator=g).to(dt)
    return sd


def nudged(
    prev: dict[str, torch.Tensor], seed: int, fraction: float = 0.02
) -> dict[str, torch.Tensor]:
    """The next version as an RL step makes it: a ``fraction`` of the floating-point
    elements moved by 1 % (a bf16 step or so), the rest unchanged, in new tensors (the
    previous version stays published as it was): what a delta from ``prev`` is made of."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, old in prev.items():
        t = old.clone()
        if t.is_floating_point() and t.numel():
            flat = t.view(-1)
            hit = torch.rand(flat.numel(), generator=g) < fraction
            flat[hit] = (flat[hit].float() * 1.01).to(t.dtype)
        out[name] = t
    return out

"""State dicts used across tests: every dtype, and the awkward cases."""

from __future__ import annotations

import torch

from tensorhub.io.tensors import TORCH_DTYPES


def _rand_bytes(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """A tensor of ``dtype`` whose bytes are random (any bit pattern, NaNs included)."""
    t = torch.empty(shape, dtype=dtype)
    if t.numel():
        raw = t.reshape(-1).view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))
    return t


def every_dtype(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    for name, dt in sorted(TORCH_DTYPES.items()):
        sd[f"{name}.matrix"] = _rand_bytes((37, 129), dt, g)
        sd[f"{name}.scalar"] = _rand_bytes((), dt, g)
        sd[f"{name}.empty"] = _rand_bytes((0, 5), dt, g)
    return sd


def awkward(seed: int = 0) -> dict[str, torch.Tensor]:
    """Non-contiguous views, shared storage, zero-size and many tiny tensors."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(300, 200, generator=g)
    sd = {
        "embed.weight": torch.randn(1000, 64, generator=g).bfloat16(),
        "transposed": base.t(),  # non-contiguous
        "strided": base[::3, 1::2],  # non-contiguous
        "slice_of_base": base[10:20],  # shares storage with base, contiguous
        "base": base,
        "zero": torch.empty(0),
        "buffer.steps": torch.tensor(12345, dtype=torch.int64),
    }
    sd["lm_head.weight"] = sd["embed.weight"]  # tied: the very same view
    for i in range(500):
        sd[f"norm.{i}"] = torch.randn(8, generator=g)
    return sd


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    )

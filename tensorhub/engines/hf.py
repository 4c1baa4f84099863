"""HF transformers models: what to publish, and loading a version into a model in place.

A transformers model's ``state_dict()`` names every parameter and persistent buffer, tied
weights under each of their names (``lm_head.weight`` and ``model.embed_tokens.weight``
are one tensor): tensorhub sends a tie once and fills both names. ``named_parameters()``
lists a tie once, so it is not what to fetch into: :func:`tensors` is both what to publish
and where to load (its tensors share the model's memory).

Non-persistent buffers (rotary ``inv_freq``, causal masks) are not in ``state_dict()``:
they are derived from the config, so a model built from the same config already has them,
and they are not moved unless ``buffers=True`` asks for them on both sides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from ..core.buckets import DEFAULT_BUCKET_BYTES
from ..core.errors import ManifestError
from ..core.manifest import Manifest
from ..hub import Hub, SyncHub
from ..io.tensors import torch_dtype


def tensors(model: torch.nn.Module, *, buffers: bool = False) -> dict[str, torch.Tensor]:
    """What a trainer publishes: ``state_dict()`` (ties shared), plus the non-persistent
    buffers when ``buffers``."""
    out = dict(model.state_dict())
    if buffers:
        for name, b in model.named_buffers(remove_duplicate=False):
            out.setdefault(name, b.detach())
    return out


@dataclass
class LoadReport:
    version: int
    loaded: list[str] = field(default_factory=list)
    buckets: int = 0
    bytes: int = 0
    largest_bucket: int = 0
    """Bytes of the largest bucket's tensors (a tie counted once): about what the stream
    held at once."""


def check(manifest: Manifest, dest: Mapping[str, torch.Tensor]) -> None:
    """Refuse a version that does not fit the model before a byte moves: every name of
    the version must exist with its shape (dtypes may differ: the copy casts, as
    ``load_state_dict`` does), and every destination must be in the version."""
    specs = {t.name: t for t in manifest.tensors}
    unexpected = [n for n in specs if n not in dest]
    missing = [n for n in dest if n not in specs]
    wrong = [
        f"{n}: {tuple(dest[n].shape)} vs {manifest.logical_shape(s)}"
        for n, s in specs.items()
        if n in dest and tuple(dest[n].shape) != manifest.logical_shape(s)
    ]
    if unexpected or missing or wrong:
        raise ManifestError(
            f"the version does not fit the model: not in the model {unexpected[:5]}, not in "
            f"the version {missing[:5]}, shapes {wrong[:5]}"
        )
    for s in manifest.tensors:
        torch_dtype(s.dtype)  # a dtype this torch cannot hold: refuse now


def _load(
    bucket: Iterable[tuple[str, torch.Tensor]], dest: Mapping[str, torch.Tensor], report: LoadReport
) -> None:
    seen: set[int] = set()  # a tie is one tensor under two names: count it once
    size = 0
    with torch.no_grad():
        for name, t in bucket:
            dest[name].copy_(t)
            report.loaded.append(name)
            if t.numel() and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                size += t.numel() * t.element_size()
    report.buckets += 1
    report.bytes += size
    report.largest_bucket = max(report.largest_bucket, size)


async def load(
    hub: Hub,
    model_name: str,
    version: int,
    model: torch.nn.Module,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    buffers: bool = False,
    timeout: float = 60.0,
) -> LoadReport:
    """Stream ``version`` into ``model`` in place, one bucket at a time: extra memory is
    one bucket, not a second model. Not atomic: a failure half way leaves the model
    partly updated (use :class:`~tensorhub.engines.StagedWeights` for that)."""
    dest = tensors(model, buffers=buffers)
    check(await hub.manifest(model_name, version, timeout=timeout), dest)
    report = LoadReport(version)
    async for bucket in hub.stream(model_name, version, bucket_bytes=bucket_bytes, timeout=timeout):
        _load(bucket, dest, report)
    return report


def load_sync(
    hub: SyncHub,
    model_name: str,
    version: int,
    model: torch.nn.Module,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    buffers: bool = False,
    timeout: float = 60.0,
) -> LoadReport:
    """:func:`load` for code that is not async."""
    dest = tensors(model, buffers=buffers)
    check(hub.manifest(model_name, version, timeout=timeout), dest)
    report = LoadReport(version)
    for bucket in hub.stream(model_name, version, bucket_bytes=bucket_bytes, timeout=timeout):
        _load(bucket, dest, report)
    return report

"""SGLang: load a tensorhub version through the engine's weight-update entry point.

SGLang's ``Engine.update_weights_from_tensor(named_tensors, load_format=None,
flush_cache=True)`` hands ``(name, tensor)`` pairs (HF names) to every tensor-parallel
worker, whose model loader fuses and shards them. :func:`load` feeds it the version bucket
by bucket from :meth:`SyncHub.stream`, so the driver holds one bucket (plus its copy on
the device SGLang ships it from), and flushes the radix cache once, after the last bucket
(``Engine.flush_cache``: KV entries computed with the old weights must not be reused).

The stream's tensors view a buffer the next bucket reuses, and SGLang serialises what it
is given to its worker processes: each bucket is copied to ``device`` first (CUDA tensors
travel by IPC handle), so nothing SGLang holds aliases the reused buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..core.buckets import DEFAULT_BUCKET_BYTES
from ..hub import SyncHub


@dataclass
class Loaded:
    version: int
    buckets: int
    tensors: int


def load(
    engine: Any,
    hub: SyncHub,
    model: str,
    version: int,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    device: str | None = None,
    timeout: float = 60.0,
) -> Loaded:
    """Stream ``version`` into a running ``sglang.Engine`` (``engine``)."""
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    buckets = tensors = 0
    for bucket in hub.stream(model, version, bucket_bytes=bucket_bytes, timeout=timeout):
        on_device = [(n, t.to(dev, copy=True)) for n, t in bucket]
        engine.update_weights_from_tensor(on_device, flush_cache=False)
        buckets += 1
        tensors += len(bucket)
    engine.flush_cache()
    return Loaded(version, buckets, tensors)

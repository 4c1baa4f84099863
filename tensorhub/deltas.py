"""Delta versions on real memory: encode v against u where both are held, rebuild v from a
held u and a fetched delta (the codec and the object's format: :mod:`tensorhub.core.delta`;
the Hub decides when: :meth:`tensorhub.Hub.publish` with ``delta_from``, and every
:meth:`tensorhub.Hub.fetch` that finds a base here and a committed delta).

Both work chunk by chunk on a pool of threads (zstd, numpy's XOR and BLAKE3 release the
GIL), because at real model sizes one core is far too slow: on one core of the 2-core CI
machine the demo's 23.4 MiB model encodes at 0.69 GB/s (lr 1e-6) to 0.27 GB/s (1e-5) and
rebuilds and verifies at 1.0 to 0.6 GB/s, so 140 GB would take minutes; on both cores,
1.12 / 0.48 GB/s and 1.84 / 1.09 GB/s (docs/results.md).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import zstandard

from .core.delta import LEVEL, DeltaError, DeltaIndex, decode_chunk, encode_chunk, pack, unpack
from .core.digest import digest
from .core.manifest import Manifest
from .io.tensors import TensorBytes

HEADER, BLOB = "header", "blob"
WORKERS = min(8, os.cpu_count() or 1)
_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    """One per thread: a zstd context may not be shared by threads at once."""
    z: zstandard.ZstdCompressor | None = getattr(_local, "z", None)
    if z is None:
        z = _local.z = zstandard.ZstdCompressor(level=LEVEL)
    return z


def _decompressor() -> zstandard.ZstdDecompressor:
    d: zstandard.ZstdDecompressor | None = getattr(_local, "d", None)
    if d is None:
        d = _local.d = zstandard.ZstdDecompressor()
    return d


def _chunk(data: TensorBytes, i: int) -> np.ndarray:
    """Chunk ``i`` as one contiguous uint8 array (a copy only where it spans tensors)."""
    parts = data.read_parts(i)
    if len(parts) == 1:
        return np.frombuffer(parts[0], np.uint8)
    return np.frombuffer(b"".join(parts), np.uint8)


def _write(data: TensorBytes, i: int, chunk: np.ndarray) -> None:
    off = 0
    for part in data.write_parts(i):
        n = len(part)
        part[:] = chunk[off : off + n].data
        off += n


def encode(
    base: TensorBytes, new: TensorBytes, manifest: Manifest, base_version: int
) -> dict[str, torch.Tensor]:
    """The delta object (its tensors, ready to publish) rebuilding ``new`` (laid out by
    ``manifest``) from ``base``, version ``base_version`` under the same layout."""

    def one(i: int) -> bytes | None:
        return encode_chunk(_chunk(base, i), _chunk(new, i), _compressor())

    with ThreadPoolExecutor(WORKERS, thread_name_prefix="delta-encode") as pool:
        encodings = list(pool.map(one, range(manifest.num_chunks)))
    header, blob = pack(base_version, encodings)
    return {HEADER: torch.from_numpy(header), BLOB: torch.from_numpy(blob)}


def index_of(delta: dict[str, torch.Tensor], num_chunks: int) -> DeltaIndex:
    """The checked index of a fetched delta object, for a version of ``num_chunks``."""
    if set(delta) != {HEADER, BLOB}:
        raise DeltaError(f"a delta object with tensors {sorted(delta)}")
    return unpack(delta[HEADER].numpy(), delta[BLOB].numel(), num_chunks)


def rebuild(
    base: TensorBytes,
    dest: TensorBytes,
    manifest: Manifest,
    index: DeltaIndex,
    blob: torch.Tensor,
) -> tuple[list[int], list[int]]:
    """Rebuild every chunk the delta encodes into ``dest`` from ``base`` (may be the same
    memory: chunk i is read whole before chunk i is written, and touches nothing else).

    Returns ``(rebuilt, refused)``: a chunk is written only once its bytes match the
    manifest's digest; ``refused`` are those that did not (a stale or corrupt base, or a
    malformed encoding), left as they were, to be fetched whole."""
    raw = blob.numpy()

    def one(i: int) -> bool:
        off, n = index.spans[i]
        try:
            chunk = decode_chunk(_chunk(base, i), bytes(raw[off : off + n].data), _decompressor())
        except DeltaError:
            return False
        if digest(chunk.data) != manifest.digests[i]:
            return False
        _write(dest, i, chunk)  # chunk i's memory only: threads never write the same bytes
        return True

    encoded = [i for i in range(len(index.spans)) if index.encoded(i)]
    with ThreadPoolExecutor(WORKERS, thread_name_prefix="delta-rebuild") as pool:
        ok = list(pool.map(one, encoded))
    rebuilt = [i for i, good in zip(encoded, ok, strict=True) if good]
    refused = [i for i, good in zip(encoded, ok, strict=True) if not good]
    return rebuilt, refused

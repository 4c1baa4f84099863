"""Delta versions: a version encoded against an older one, chunk by chunk (issue #21).

At RL learning rates most bf16 weights do not change from one step to the next, so a node
that holds v-1 needs a few percent of a model to reach v. A delta of version v from a
base u is a small object of its own, published under :func:`delta_model` as version v
and committed like any version, so it is swarmed like any version: holders keep its
encoded bytes and serve them onward, with locality and the once-per-datacenter WAN rule.

Per chunk of v, the delta holds the XOR of v's and u's bytes compressed with zstd (level
3): on consecutive checkpoints it won every chunk against XOR+lz4 and a sparse encoding
(``bench/deltas.py``, docs/results.md). A chunk whose encoding would not save at least
:data:`MIN_SAVING` is left out: it travels whole. Nothing here is trusted for integrity:
a reconstructed chunk counts only if it matches v's committed chunk digest, and one that
does not (a stale or corrupt base) is fetched whole. The encoding is only checked for
being well formed, so that a bad one fails with a clear error instead of a crash or a
decompression bomb.

The object's two tensors: ``header`` (int64: format, base version, chunk count, then an
(offset, length) pair per chunk; length 0 means "not in the delta") and ``blob`` (uint8:
the encoded chunks back to back). This module is pure: arrays in, arrays out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import zstandard

from .errors import TensorHubError
from .manifest import Manifest

FORMAT = 1
SUFFIX = "~delta"
LEVEL = 3
MIN_SAVING = 0.1
"""A chunk goes into the delta only if its encoding is at most 90 % of the chunk: a chunk
that changed almost everywhere costs less whole than encoded and decoded."""


class DeltaError(TensorHubError):
    """A delta object is malformed (its chunks then travel whole)."""


def delta_model(model: str) -> str:
    """The registry name under which ``model``'s deltas are committed (version v: the
    delta that rebuilds v)."""
    return model + SUFFIX


def same_layout(a: Manifest, b: Manifest) -> bool:
    """Whether chunk i of ``a`` and of ``b`` cover the same tensor bytes, for every i: a
    delta between them is defined chunk by chunk only then."""
    la, lb = a.layout, b.layout
    return (
        la.chunk_size == lb.chunk_size
        and la.align == lb.align
        and la.tensors == lb.tensors
        and a.transforms == b.transforms
    )


@dataclass(frozen=True)
class DeltaIndex:
    """Where each chunk's encoding lies in the blob; ``(0, 0)``: not in the delta."""

    base: int
    spans: tuple[tuple[int, int], ...]

    def encoded(self, chunk: int) -> bool:
        return self.spans[chunk][1] > 0

    @property
    def chunks(self) -> int:
        """Chunks the delta can rebuild."""
        return sum(1 for _, n in self.spans if n)


def xor_zstd(base: np.ndarray, new: np.ndarray, z: zstandard.ZstdCompressor) -> bytes:
    """``new`` against ``base`` (two uint8 arrays of one chunk): their XOR, compressed
    (what ``bench/deltas.py`` measures as "xor+zstd", and what a delta carries)."""
    return bytes(z.compress(np.bitwise_xor(base, new).data))


def encode_chunk(base: np.ndarray, new: np.ndarray, z: zstandard.ZstdCompressor) -> bytes | None:
    """The encoding of ``new`` against ``base`` (:func:`xor_zstd`), or None where it
    would not save :data:`MIN_SAVING` of the chunk."""
    enc = xor_zstd(base, new, z)
    return enc if len(enc) <= (1.0 - MIN_SAVING) * len(new) else None


def decode_chunk(base: np.ndarray, enc: bytes, d: zstandard.ZstdDecompressor) -> np.ndarray:
    """The chunk rebuilt from ``base`` (uint8) and its encoding; :class:`DeltaError` if
    the encoding does not decode to exactly a chunk's length."""
    try:
        x = d.decompress(enc, max_output_size=len(base))
    except zstandard.ZstdError as e:
        raise DeltaError(f"a delta chunk does not decode: {e}") from None
    if len(x) != len(base):
        raise DeltaError(f"a delta chunk decodes to {len(x)} bytes, not {len(base)}")
    out: np.ndarray = np.bitwise_xor(base, np.frombuffer(x, np.uint8))
    return out


def pack(base: int, encodings: list[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """``(header, blob)`` for a delta from version ``base`` with one encoding (or None)
    per chunk. The blob is never empty (a tensor of no bytes has no chunk to commit)."""
    header = np.zeros(3 + 2 * len(encodings), np.int64)
    header[:3] = (FORMAT, base, len(encodings))
    parts: list[bytes] = []
    offset = 0
    for i, enc in enumerate(encodings):
        if enc:
            header[3 + 2 * i : 5 + 2 * i] = (offset, len(enc))
            parts.append(enc)
            offset += len(enc)
    blob = np.frombuffer(b"".join(parts) or b"\0", np.uint8).copy()
    return header, blob


def unpack(header: np.ndarray, blob_bytes: int, num_chunks: int) -> DeltaIndex:
    """The index of a delta object for a version of ``num_chunks`` chunks, checked: every
    span inside the blob, in order, none overlapping."""
    if header.ndim != 1 or len(header) < 3:
        raise DeltaError(f"a delta header of shape {tuple(header.shape)}")
    fmt, base, n = (int(x) for x in header[:3])
    if fmt != FORMAT:
        raise DeltaError(f"delta format {fmt}, this node reads {FORMAT}")
    if n != num_chunks or len(header) != 3 + 2 * n:
        raise DeltaError(f"a delta of {n} chunks ({len(header)} header words) for {num_chunks}")
    if base < 1:
        raise DeltaError(f"a delta from version {base}")
    spans: list[tuple[int, int]] = []
    end = 0
    for i in range(n):
        off, length = int(header[3 + 2 * i]), int(header[4 + 2 * i])
        if length == 0:
            spans.append((0, 0))
            continue
        if length < 0 or off < end or off + length > blob_bytes:
            raise DeltaError(f"delta chunk {i}: span {off}+{length} outside the blob")
        spans.append((off, length))
        end = off + length
    return DeltaIndex(base, tuple(spans))

"""Some chunks of a version, packed into one buffer: what a partial read lands in.

A full fetch writes each chunk straight into the caller's tensors (:class:`TensorBytes`).
A partial read has no such tensors: a stream hands out one bucket at a time from a buffer
it reuses, a tensor-parallel rank keeps only its rows. :class:`ChunkBuffer` gives the
swarm the same chunk interface over ``len(chunks)`` chunk-sized slots of one uint8
tensor (padding included: the digest covers it), and reads tensors and byte ranges of the
flat layout back out of it (as typed tensors: :class:`tensorhub.reads.Read`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..core.layout import Layout
from .tensors import TensorBytes, byte_view


class ChunkBuffer(TensorBytes):
    """Chunks ``chunks`` of ``layout`` in slots of ``buffer`` (a CPU uint8 tensor of at
    least ``len(chunks) * chunk_size`` bytes; allocated when None), in the given order."""

    def __init__(
        self, layout: Layout, chunks: Sequence[int], buffer: torch.Tensor | None = None
    ) -> None:
        need = len(chunks) * layout.chunk_size
        if buffer is None:
            buffer = torch.empty(need, dtype=torch.uint8)
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < need:
            raise ValueError(f"a ChunkBuffer needs a 1-D uint8 tensor of >= {need} bytes")
        super().__init__(layout, [], [buffer])
        self.buffer = buffer
        self.chunks = list(chunks)
        self._slot = {c: k for k, c in enumerate(self.chunks)}
        self._bytes = byte_view(buffer)
        self.borrowed = False

    def _part(self, i: int) -> memoryview:
        try:
            k = self._slot[i]
        except KeyError:
            raise IndexError(f"chunk {i} is not in this buffer") from None
        start = k * self.layout.chunk_size
        return self._bytes[start : start + self.layout.chunk_len(i)]

    def read_parts(self, i: int) -> list[memoryview]:
        return [self._part(i)]

    def write_parts(self, i: int) -> list[memoryview]:
        return [self._part(i)]

    def _contiguous_at(self, start: int, end: int) -> int | None:
        """Buffer offset of flat bytes [start, end) if they lie in consecutive slots."""
        cs = self.layout.chunk_size
        first, last = start // cs, (end - 1) // cs
        k = self._slot.get(first)
        if k is None or any(self._slot.get(c) != k + c - first for c in range(first, last + 1)):
            return None
        return k * cs + start - first * cs

    def gather(self, start: int, end: int) -> torch.Tensor:
        """Flat-layout bytes [start, end) as a uint8 tensor: a view when they sit in
        consecutive slots, else a copy."""
        if end <= start:
            return torch.empty(0, dtype=torch.uint8)
        at = self._contiguous_at(start, end)
        if at is not None:
            return self.buffer[at : at + end - start]
        cs = self.layout.chunk_size
        out = torch.empty(end - start, dtype=torch.uint8)
        pos = start
        while pos < end:
            c = pos // cs
            n = min(end, (c + 1) * cs) - pos
            k = self._slot.get(c)
            if k is None:
                raise IndexError(f"bytes {pos}..{pos + n} are in chunk {c}, not in this buffer")
            src = k * cs + pos - c * cs
            out[pos - start : pos - start + n] = self.buffer[src : src + n]
            pos += n
        return out

    def move(self, chunk: int, to: int) -> None:
        """Copy ``chunk``'s bytes from its slot to slot ``to`` (a stream carrying a shared
        boundary chunk into the next bucket's first slot)."""
        src = self._part(chunk)
        cs = self.layout.chunk_size
        self._bytes[to * cs : to * cs + len(src)] = src

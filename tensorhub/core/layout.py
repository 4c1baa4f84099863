"""Flat byte layout of a state_dict, cut into fixed-size chunks.

Tensors are laid end to end in state_dict order, each aligned to ``align`` bytes, and the
result is cut into ``chunk_size`` chunks. Small tensors therefore share chunks (a model
with thousands of tiny tensors costs no per-tensor round trips) and a large tensor spans
many. A chunk maps back to a short list of :class:`Segment` s, so received bytes can land
directly in the destination tensors (scatter) with no staging copy.

The layout is canonical: it is a pure function of (names, dtypes, shapes, aliases,
chunk_size, align), which is what lets a manifest be validated by planning it again.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import msgspec

from .dtypes import itemsize
from .errors import ManifestError

MiB = 1 << 20
DEFAULT_CHUNK_SIZE = 4 * MiB
"""Default chunk size. 4 MiB keeps per-chunk overhead (one request, one digest) below 0.1 %
of the bytes moved while leaving a 1 GiB model 256 chunks to spread over a swarm."""
MIN_CHUNK_SIZE = 4096
MAX_CHUNK_SIZE = 64 * MiB
DEFAULT_ALIGN = 64
"""Every tensor starts on a 64-byte boundary of the flat layout, so a flat copy of a
version (a CPU copy kept for retention) can be viewed as typed tensors at full speed."""
PADDING = -1
"""Segment.tensor value for alignment fill between tensors (always zero bytes)."""
MAX_TENSORS = 1_000_000


@dataclass(frozen=True)
class TensorDesc:
    """What the caller says about one tensor: the input to :func:`plan_layout`."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    alias_of: str | None = None
    """Name of an earlier tensor with the very same bytes (tied weights): sent once."""


class TensorSpec(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One tensor's place in the flat layout (as it travels inside a manifest)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    alias_of: str | None = None


class Segment(NamedTuple):
    """A run of a chunk's bytes: ``length`` bytes at byte ``start`` of tensor ``tensor``."""

    tensor: int
    start: int
    length: int


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _check_geometry(chunk_size: int, align: int) -> None:
    if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise ManifestError(f"chunk_size {chunk_size} outside [{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}]")
    if align < 1 or align > 4096 or align & (align - 1):
        raise ManifestError(f"align {align} is not a power of two in [1, 4096]")


def plan_layout(
    descs: Iterable[TensorDesc],
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    align: int = DEFAULT_ALIGN,
) -> Layout:
    """Place ``descs`` in a flat layout; refuse anything inconsistent with a clear error."""
    _check_geometry(chunk_size, align)
    specs: list[TensorSpec] = []
    by_name: dict[str, TensorSpec] = {}
    pos = 0
    for d in descs:
        if not isinstance(d.name, str) or not d.name:
            raise ManifestError(f"tensor name must be a non-empty string, got {d.name!r}")
        if d.name in by_name:
            raise ManifestError(f"duplicate tensor name {d.name!r}")
        if not all(isinstance(s, int) and s >= 0 for s in d.shape):
            raise ManifestError(f"tensor {d.name!r}: bad shape {d.shape!r}")
        nbytes = _numel(d.shape) * itemsize(d.dtype)
        if d.alias_of is not None:
            target = by_name.get(d.alias_of)
            if target is None or target.alias_of is not None:
                raise ManifestError(
                    f"tensor {d.name!r}: alias_of {d.alias_of!r} must name an earlier, "
                    "non-alias tensor"
                )
            if (target.dtype, target.shape) != (d.dtype, tuple(d.shape)):
                raise ManifestError(
                    f"tensor {d.name!r}: alias of {d.alias_of!r} with a different dtype or shape"
                )
            spec = TensorSpec(d.name, d.dtype, tuple(d.shape), target.offset, nbytes, d.alias_of)
        else:
            pos = -(-pos // align) * align
            spec = TensorSpec(d.name, d.dtype, tuple(d.shape), pos, nbytes)
            pos += nbytes
        specs.append(spec)
        by_name[d.name] = spec
        if len(specs) > MAX_TENSORS:
            raise ManifestError(f"more than {MAX_TENSORS} tensors")
    return Layout(tuple(specs), chunk_size, align)


class Layout:
    """A planned flat layout; answers which bytes of which tensors form chunk ``i``."""

    __slots__ = ("_ends", "_phys", "_segments", "_starts", "align", "chunk_size", "tensors")

    def __init__(self, tensors: tuple[TensorSpec, ...], chunk_size: int, align: int) -> None:
        self.tensors = tensors
        self.chunk_size = chunk_size
        self.align = align
        # Physical tensors: the ones that own bytes (not aliases, not empty), in offset order.
        self._phys = [i for i, t in enumerate(tensors) if t.alias_of is None and t.nbytes > 0]
        self._starts = [tensors[i].offset for i in self._phys]
        self._ends = [tensors[i].offset + tensors[i].nbytes for i in self._phys]
        self._segments: dict[int, tuple[Segment, ...]] = {}

    @property
    def total_bytes(self) -> int:
        return self._ends[-1] if self._ends else 0

    @property
    def num_chunks(self) -> int:
        return -(-self.total_bytes // self.chunk_size)

    def descs(self) -> list[TensorDesc]:
        return [TensorDesc(t.name, t.dtype, t.shape, t.alias_of) for t in self.tensors]

    def chunk_range(self, i: int) -> tuple[int, int]:
        """Byte range [start, end) of chunk ``i`` in the flat layout."""
        if not 0 <= i < self.num_chunks:
            raise IndexError(f"chunk {i} out of range [0, {self.num_chunks})")
        start = i * self.chunk_size
        return start, min(start + self.chunk_size, self.total_bytes)

    def chunk_len(self, i: int) -> int:
        start, end = self.chunk_range(i)
        return end - start

    def segments(self, i: int) -> tuple[Segment, ...]:
        """The runs of tensor bytes (and zero padding) that make up chunk ``i``, in order."""
        cached = self._segments.get(i)
        if cached is not None:
            return cached
        start, end = self.chunk_range(i)
        out: list[Segment] = []
        k = max(bisect.bisect_right(self._starts, start) - 1, 0)
        pos = start
        while pos < end:
            t_start, t_end = self._starts[k], self._ends[k]
            if pos < t_start:  # alignment padding before tensor k
                n = min(t_start, end) - pos
                out.append(Segment(PADDING, 0, n))
            elif pos < t_end:
                n = min(t_end, end) - pos
                out.append(Segment(self._phys[k], pos - t_start, n))
            else:
                k += 1
                continue
            pos += n
        segs = tuple(out)
        self._segments[i] = segs
        return segs

    def chunks_of(self, tensor: int) -> range:
        """The chunks that hold any byte of tensor ``tensor`` (its alias target's, if alias)."""
        spec = self.tensors[tensor]
        if spec.nbytes == 0:
            return range(0)
        first = spec.offset // self.chunk_size
        last = (spec.offset + spec.nbytes - 1) // self.chunk_size
        return range(first, last + 1)

    def index(self) -> dict[str, int]:
        return {t.name: i for i, t in enumerate(self.tensors)}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and (self.tensors, self.chunk_size, self.align) == (
            other.tensors,
            other.chunk_size,
            other.align,
        )

    def __hash__(self) -> int:
        return hash((self.tensors, self.chunk_size, self.align))

"""Which chunks a partial read needs: buckets for a stream, byte ranges for a slice.

A version's bytes are one flat layout cut into chunks (:mod:`.layout`), and a chunk is
the unit that is verified against the committed manifest. So every partial read is
planned in whole chunks: a *stream* walks the version in buckets of consecutive chunks
that hold whole tensors (memory stays bounded by one bucket), and a *slice* of a tensor
(a tensor-parallel rank's rows) needs only the chunks its bytes fall in. Pure functions:
the Hub does the I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .errors import ManifestError
from .layout import Layout, TensorSpec

DEFAULT_BUCKET_BYTES = 512 << 20
"""A stream's default bucket: big enough that the largest tensor of a 70B model (the
embedding, ~2 GiB in bf16, is the exception: it gets a bucket of its own) rarely splits a
bucket, small next to the model."""


@dataclass
class Bucket:
    """Consecutive chunks [first, end) and the tensors (indexes into the layout) whose
    bytes lie wholly inside them: aliases ride with their target, empty tensors anywhere."""

    first: int
    end: int
    tensors: list[int] = field(default_factory=list)

    @property
    def chunks(self) -> range:
        return range(self.first, self.end)


def _chunk_span(spec: TensorSpec, chunk_size: int) -> tuple[int, int]:
    return spec.offset // chunk_size, (spec.offset + spec.nbytes - 1) // chunk_size + 1


def plan_buckets(layout: Layout, bucket_bytes: int) -> list[Bucket]:
    """Cut ``layout`` into buckets of at most ``bucket_bytes`` of chunks each (a tensor
    larger than that gets a bucket of its own, as large as it needs). Consecutive buckets
    may share one boundary chunk, which a stream carries over instead of fetching twice."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    cs = layout.chunk_size
    buckets: list[Bucket] = []
    home: dict[str, Bucket] = {}  # tensor name -> its bucket (aliases look targets up)
    empty: list[int] = []  # empty tensors before the first bucket exists
    for i, spec in enumerate(layout.tensors):
        if spec.alias_of is not None:
            target = home.get(spec.alias_of)
            (target.tensors if target is not None else empty).append(i)
            continue
        if spec.nbytes == 0:
            (buckets[-1].tensors if buckets else empty).append(i)
            continue
        first, end = _chunk_span(spec, cs)
        cur = buckets[-1] if buckets else None
        if cur is None or (end - cur.first) * cs > bucket_bytes:
            cur = Bucket(first, end)
            buckets.append(cur)
        cur.end = max(cur.end, end)
        cur.tensors.append(i)
        home[spec.name] = cur
    if empty:  # a version of empty tensors only, or aliases of empty ones
        if not buckets:
            buckets.append(Bucket(0, 0))
        buckets[0].tensors[:0] = empty
    return buckets


def bucket_capacity(buckets: Sequence[Bucket], chunk_size: int) -> int:
    """Bytes of the one buffer every bucket of a stream fits in."""
    return max((b.end - b.first for b in buckets), default=0) * chunk_size


@dataclass(frozen=True)
class RowSlice:
    """Rows [start, stop) of a tensor along its first dimension: a tensor-parallel rank's
    share of a column-parallel weight (or of a vocabulary), contiguous in the flat layout."""

    start: int
    stop: int


def row_bytes(spec: TensorSpec) -> int:
    """Bytes of one row (one index of the first dimension)."""
    return spec.nbytes // spec.shape[0] if spec.shape and spec.shape[0] else 0


def slice_range(spec: TensorSpec, rows: RowSlice) -> tuple[int, int]:
    """Flat-layout bytes [start, end) that hold ``rows`` of ``spec``."""
    if not 0 <= rows.start <= rows.stop <= (spec.shape[0] if spec.shape else 0):
        raise ManifestError(f"{spec.name!r}: rows {rows.start}:{rows.stop} outside {spec.shape}")
    per = row_bytes(spec)
    return spec.offset + rows.start * per, spec.offset + rows.stop * per


def chunks_for(ranges: Mapping[str, tuple[int, int]], chunk_size: int) -> list[int]:
    """The chunks that hold every byte of ``ranges`` (name -> flat [start, end)), sorted."""
    need: set[int] = set()
    for start, end in ranges.values():
        if end > start:
            need.update(range(start // chunk_size, (end - 1) // chunk_size + 1))
    return sorted(need)

"""The torch side of the layout: byte views of real tensors, chunk by chunk.

:class:`TensorBytes` is what chunks are read from (a publisher's state_dict) and written
into (a fetcher's preallocated destination). Views alias tensor memory, so a received
chunk lands in the destination tensors with no staging copy. Two exceptions, both
explicit: a non-contiguous *source* tensor is published from a contiguous copy made once at
publish time, and a non-contiguous *destination* is filled through a staging buffer copied
into it by :meth:`TensorBytes.finalize`. Device (CUDA) tensors go through pinned host
memory (:mod:`.device`): a snapshot taken at publish time, a mirror copied to the device
chunk by chunk as a fetch verifies them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ..core.digest import digest, digest_parts
from ..core.dtypes import ITEMSIZE
from ..core.errors import ManifestError
from ..core.layout import (
    DEFAULT_ALIGN,
    DEFAULT_CHUNK_SIZE,
    PADDING,
    Layout,
    TensorDesc,
    plan_layout,
)
from ..core.manifest import Applied, Manifest
from .device import DeviceCopies, PinnedArena, on_host, snapshot

TORCH_DTYPES: dict[str, torch.dtype] = {
    name: dt for name in ITEMSIZE if isinstance(dt := getattr(torch, name, None), torch.dtype)
}
_NAMES: dict[torch.dtype, str] = {dt: name for name, dt in TORCH_DTYPES.items()}
_ZEROS = memoryview(bytes(4096))


def dtype_name(dt: torch.dtype) -> str:
    try:
        return _NAMES[dt]
    except KeyError:
        raise ManifestError(f"dtype {dt} cannot be moved as raw bytes by tensorhub") from None


def torch_dtype(name: str) -> torch.dtype:
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise ManifestError(f"dtype {name!r} is not available in this torch build") from None


def byte_view(t: torch.Tensor) -> memoryview:
    """Writable flat bytes of a contiguous CPU tensor, aliasing its memory."""
    if not on_host(t):
        raise ValueError(f"byte_view needs a CPU tensor, not one on {t.device}")
    if not t.is_contiguous():
        raise ValueError("byte_view needs a contiguous tensor")
    if t.numel() == 0:
        return memoryview(bytearray(0))
    arr = t.detach().reshape(-1).view(torch.uint8).numpy()
    return memoryview(arr).cast("B")  # type: ignore[arg-type]  # numpy arrays are buffers


def _extents(tensors: Iterable[torch.Tensor]) -> list[tuple[str, int, int]]:
    """(device, first byte, end) of each non-empty tensor's memory."""
    out = []
    for t in tensors:
        if t.numel():
            span = 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride(), strict=True))
            start = t.data_ptr()
            out.append((str(t.device), start, start + span * t.element_size()))
    return out


def _alias_key(t: torch.Tensor) -> tuple[object, ...]:
    return (
        t.untyped_storage().data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
        t.device,
    )


@dataclass
class _Pending:
    """A destination that needs a copy after all bytes arrived."""

    dest: torch.Tensor
    src: torch.Tensor


class TensorBytes:
    """Per-tensor byte views under one layout; reads and writes chunks as memoryview lists."""

    def __init__(
        self,
        layout: Layout,
        views: list[memoryview],
        keep: list[object],
        pending: list[_Pending] | None = None,
        copies: DeviceCopies | None = None,
    ) -> None:
        self.layout = layout
        self._views = views
        self._keep = keep  # tensors (and pinned arenas) the views point into
        self.targets: list[torch.Tensor] = []
        """The caller's tensors these bytes are served from or land in."""
        self.borrowed = True
        """Whether the caller may reuse that memory (then this copy does not last: the
        mutability contract ends it); False for copies tensorhub owns (kept copies, pinned
        snapshots of device tensors)."""
        self._pending = pending or []
        self._copies = copies
        self._copied = bytearray(layout.num_chunks)

    def read_parts(self, i: int) -> list[memoryview]:
        """Chunk ``i`` as views of tensor memory (padding as zeros), ready to send."""
        out = []
        for seg in self.layout.segments(i):
            if seg.tensor == PADDING:
                out.append(_ZEROS[: seg.length])
            else:
                out.append(self._views[seg.tensor][seg.start : seg.start + seg.length])
        return out

    def write_parts(self, i: int) -> list[memoryview]:
        """Chunk ``i`` as writable views of destination memory (padding into scratch)."""
        out = []
        for seg in self.layout.segments(i):
            if seg.tensor == PADDING:
                out.append(memoryview(bytearray(seg.length)))
            else:
                out.append(self._views[seg.tensor][seg.start : seg.start + seg.length])
        return out

    def chunk_digest(self, i: int) -> bytes:
        """Chunk ``i``'s digest (one thread; :func:`build_manifest` hashes chunks side by
        side)."""
        return digest_parts(self.read_parts(i))

    def landed(self, i: int) -> None:
        """Chunk ``i`` is verified: queue its copy into device destinations (if any)."""
        if self._copies and not self._copied[i]:
            self._copied[i] = 1
            self._copies.copy(
                (seg.tensor, seg.start, seg.length)
                for seg in self.layout.segments(i)
                if seg.tensor != PADDING
            )

    def finalize(self) -> None:
        """Finish device copies, copy staged bytes into non-contiguous destinations and
        fill untied aliases."""
        if self._copies:
            for i in range(self.layout.num_chunks):
                self.landed(i)  # chunks filled without landed() (a local copy, say)
            self._copies.wait()
        for p in self._pending:
            p.dest.copy_(p.src)

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def from_state_dict(
        cls,
        tensors: Mapping[str, torch.Tensor],
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        align: int = DEFAULT_ALIGN,
    ) -> TensorBytes:
        """Views of a publisher's tensors. Tensors that are the very same view (tied
        weights) are sent once; non-contiguous ones are copied once, here."""
        descs: list[TensorDesc] = []
        seen: dict[tuple[object, ...], str] = {}
        picked: list[torch.Tensor] = []
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name!r} is a {type(t).__name__}, not a torch.Tensor")
            alias = seen.get(_alias_key(t)) if t.numel() else None
            if alias is None and t.numel():
                seen[_alias_key(t)] = name
            descs.append(TensorDesc(name, dtype_name(t.dtype), tuple(t.shape), alias))
            ok = t.is_contiguous() or not on_host(t)  # device tensors: snapshot() copies
            picked.append(t.detach() if ok else t.detach().contiguous())
        layout = plan_layout(descs, chunk_size, align)
        host, arena = snapshot(picked)
        out = cls(layout, [byte_view(t) for t in host], [*host, arena])
        out.targets = list(tensors.values())
        out.borrowed = any(on_host(t) for t in tensors.values())  # CPU: served in place
        return out

    def shares_memory(self, tensors: Iterable[torch.Tensor]) -> bool:
        """Whether any of ``tensors`` overlaps the caller memory these bytes belong to."""
        mine = _extents(self.targets)
        if not mine:
            return False
        return any(d == e and a < y and x < b for d, a, b in _extents(tensors) for e, x, y in mine)

    @classmethod
    def for_destination(cls, manifest: Manifest, into: Mapping[str, torch.Tensor]) -> TensorBytes:
        """Views of a fetcher's preallocated tensors; refuses any mismatch before a byte moves."""
        layout = manifest.layout
        names = {t.name for t in layout.tensors}
        missing = [t.name for t in layout.tensors if t.name not in into]
        extra = [n for n in into if n not in names]
        if missing or extra:
            raise ManifestError(
                f"destination does not match the version: missing {missing[:5]}"
                f"{'…' if len(missing) > 5 else ''}, unexpected {extra[:5]}"
                f"{'…' if len(extra) > 5 else ''}"
            )
        for spec in layout.tensors:  # all checked before any memory is pinned
            dest = into[spec.name]
            if dest.dtype != torch_dtype(spec.dtype) or tuple(dest.shape) != spec.shape:
                raise ManifestError(
                    f"destination {spec.name!r} is {dest.dtype} {tuple(dest.shape)}, "
                    f"the version has {spec.dtype} {spec.shape}"
                )
        views: list[memoryview] = []
        keep: list[object] = []
        staged: list[_Pending] = []
        aliases: list[_Pending] = []
        device = [
            into[s.name] for s in layout.tensors if s.alias_of is None and not on_host(into[s.name])
        ]
        arena, twins = PinnedArena.carve(device)
        keep.append(arena)
        copies = DeviceCopies(arena)
        for index, spec in enumerate(layout.tensors):
            dest = into[spec.name]
            if spec.alias_of is not None:
                target = into[spec.alias_of]
                if _alias_key(target) != _alias_key(dest):
                    aliases.append(_Pending(dest, target))
                views.append(memoryview(bytearray(0)))
                keep.append(dest)
                continue
            if dest.is_contiguous() and on_host(dest):
                views.append(byte_view(dest))
                keep.append(dest)
            elif not on_host(dest):  # received into pinned memory, copied chunk by chunk
                buf = next(twins)
                views.append(byte_view(buf))
                keep.append(buf)
                if dest.is_contiguous() and dest.device.type == "cuda":
                    copies.add(index, buf, dest)
                else:
                    staged.append(_Pending(dest, buf))
            else:
                buf = torch.empty(spec.shape, dtype=dest.dtype)
                views.append(byte_view(buf))
                keep.append(buf)
                staged.append(_Pending(dest, buf))
        # An alias is copied from its target's destination, so after the target's staging.
        out = cls(layout, views, keep, staged + aliases, copies)
        out.targets = list(into.values())
        return out


def build_manifest(src: TensorBytes, transforms: Sequence[Applied] = ()) -> Manifest:
    """Hash every chunk of ``src`` (BLAKE3-128, over all cores) and build its manifest
    (recording the publish-time ``transforms`` that made its tensors)."""
    n = src.layout.num_chunks
    workers = min(n, os.cpu_count() or 1)
    if workers <= 1:
        digests = [src.chunk_digest(i) for i in range(n)]
    else:
        # Chunks side by side on our own threads (BLAKE3 releases the GIL), not one chunk
        # at a time over BLAKE3's Rayon pool: a trainer in a Ray actor under CPU
        # contention was seen (py-spy) waiting for minutes inside the Rayon-threaded hash.
        with ThreadPoolExecutor(workers, thread_name_prefix="tensorhub-hash") as pool:
            digests = list(pool.map(src.chunk_digest, range(n)))
    return Manifest(src.layout, digests, transforms)


def empty_like_manifest(
    manifest: Manifest, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """Fresh, pre-touched tensors shaped like the version (aliases tied as published)."""
    out: dict[str, torch.Tensor] = {}
    for spec in manifest.tensors:
        if spec.alias_of is not None:
            out[spec.name] = out[spec.alias_of]
        else:
            t = torch.empty(spec.shape, dtype=torch_dtype(spec.dtype), device=device)
            # Touch every page now, so page faults stay off the receive path.
            t.reshape(-1).view(torch.uint8).zero_()
            out[spec.name] = t
    return out


def copy_chunk(src: TensorBytes, dst: TensorBytes, manifest: Manifest, i: int) -> bool:
    """Copy chunk ``i`` between two buffers laid out by ``manifest``, however each cuts it
    into parts (a chunk's tensor segments, or one flat slot of a partial read's buffer),
    and check the copy against the manifest. False: the source did not hold the chunk it
    should (it changed)."""
    _copy_parts(src.read_parts(i), dst.write_parts(i))
    return digest_parts(dst.read_parts(i)) == manifest.digests[i]


def _copy_parts(src: list[memoryview], dst: list[memoryview]) -> None:
    """Copy the concatenation of ``src`` into that of ``dst`` (equal total lengths)."""
    i = j = si = dj = 0
    while i < len(src) and j < len(dst):
        k = min(len(src[i]) - si, len(dst[j]) - dj)
        dst[j][dj : dj + k] = src[i][si : si + k]
        si, dj = si + k, dj + k
        if si == len(src[i]):
            i, si = i + 1, 0
        if dj == len(dst[j]):
            j, dj = j + 1, 0


def tensor_digests(tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """BLAKE3-128 (hex) of each tensor's bytes: compare two state_dicts across processes."""
    return {k: digest(byte_view(t.contiguous().cpu())).hex() for k, t in tensors.items()}

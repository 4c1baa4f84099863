"""Manifests: a version's layout plus one digest per chunk, and a root digest over both.

The root is what the registry commits for (model, version): a fetcher that knows the root
refuses any manifest that does not hash to it, and every chunk is checked against the
manifest before it is stored, served or handed to the caller.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .digest import DIGEST_SIZE, digest
from .errors import ManifestError
from .layout import Layout, TensorDesc, TensorSpec, plan_layout

FORMAT = 1
MAX_MANIFEST_BYTES = 256 << 20
_ROOT_DOMAIN = b"tensorhub/manifest/v1\0"


class _ManifestWire(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    format: int
    chunk_size: int
    align: int
    total_bytes: int
    tensors: tuple[TensorSpec, ...]
    digests: tuple[bytes, ...]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_ManifestWire)


class Manifest:
    """An immutable, validated manifest. Build one with :meth:`build` or :meth:`decode`."""

    __slots__ = ("_encoded", "digests", "layout", "root")

    def __init__(self, layout: Layout, digests: Sequence[bytes]) -> None:
        digests = tuple(bytes(d) for d in digests)
        if len(digests) != layout.num_chunks:
            raise ManifestError(
                f"{len(digests)} chunk digests for a layout of {layout.num_chunks} chunks"
            )
        for i, d in enumerate(digests):
            if len(d) != DIGEST_SIZE:
                raise ManifestError(f"chunk {i}: digest of {len(d)} bytes, want {DIGEST_SIZE}")
        self.layout = layout
        self.digests = digests
        self._encoded = _encoder.encode(
            _ManifestWire(
                FORMAT,
                layout.chunk_size,
                layout.align,
                layout.total_bytes,
                layout.tensors,
                digests,
            )
        )
        self.root = digest(_ROOT_DOMAIN + self._encoded)

    @property
    def num_chunks(self) -> int:
        return self.layout.num_chunks

    @property
    def total_bytes(self) -> int:
        return self.layout.total_bytes

    @property
    def tensors(self) -> tuple[TensorSpec, ...]:
        return self.layout.tensors

    def encode(self) -> bytes:
        """Canonical msgpack bytes; the root digest is computed over exactly these."""
        return self._encoded

    @classmethod
    def decode(cls, data: bytes | memoryview, expected_root: bytes | None = None) -> Manifest:
        """Parse and fully validate ``data``; refuse anything inconsistent.

        The layout is planned again from the tensor descriptions and must match the
        offsets and sizes given, so a manifest cannot point a chunk outside its tensors.
        """
        if len(data) > MAX_MANIFEST_BYTES:
            raise ManifestError(f"manifest of {len(data)} bytes exceeds {MAX_MANIFEST_BYTES}")
        try:
            wire = _decoder.decode(data)
        except (msgspec.DecodeError, ValueError) as e:  # ValueError: e.g. invalid UTF-8
            raise ManifestError(f"malformed manifest: {e}") from None
        if wire.format != FORMAT:
            raise ManifestError(f"manifest format {wire.format}, this build reads {FORMAT}")
        layout = plan_layout(
            [TensorDesc(t.name, t.dtype, tuple(t.shape), t.alias_of) for t in wire.tensors],
            wire.chunk_size,
            wire.align,
        )
        for given, planned in zip(wire.tensors, layout.tensors, strict=True):
            if (given.offset, given.nbytes) != (planned.offset, planned.nbytes):
                raise ManifestError(
                    f"tensor {given.name!r}: offset/nbytes ({given.offset}, {given.nbytes}) "
                    f"do not match the canonical layout ({planned.offset}, {planned.nbytes})"
                )
        if wire.total_bytes != layout.total_bytes:
            raise ManifestError(
                f"total_bytes {wire.total_bytes} != {layout.total_bytes} from the tensors"
            )
        manifest = cls(layout, wire.digests)
        if expected_root is not None and manifest.root != expected_root:
            raise ManifestError(
                f"manifest root {manifest.root.hex()} != expected {bytes(expected_root).hex()}"
            )
        return manifest

    def __repr__(self) -> str:
        return (
            f"Manifest(root={self.root.hex()[:16]}…, tensors={len(self.tensors)}, "
            f"bytes={self.total_bytes}, chunks={self.num_chunks})"
        )

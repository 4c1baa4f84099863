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


class Applied(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One publish-time transform, as the manifest records it (see
    :mod:`tensorhub.transforms`): published tensor ``name`` was made from the publisher's
    ``sources`` by ``kind``. Readers use it to undo a layout (``shard_major``) or to know
    what they load (a cast, fp8 scales); it is committed with the root like the rest."""

    kind: str  # "rename" | "cast" | "fp8" | "fuse" | "shard_major"
    name: str
    sources: tuple[str, ...]
    dtype: str = ""  # the sources' dtype before a cast or fp8 quantisation
    dim: int = 0  # fuse: the dimension concatenated; shard_major: the one made rank-major
    parts: tuple[int, ...] = ()  # fuse: each source's size; shard_major: (world,); fp8: block
    world: int = 1  # fuse: laid out rank by rank for this many tensor-parallel ranks


KINDS = ("rename", "cast", "fp8", "fuse", "shard_major")


class _ManifestWire(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    format: int
    chunk_size: int
    align: int
    total_bytes: int
    tensors: tuple[TensorSpec, ...]
    digests: tuple[bytes, ...]


class _TransformedWire(_ManifestWire, frozen=True):
    """A manifest with transforms: one more trailing field. Without any, a manifest is
    encoded as :class:`_ManifestWire`, so its bytes (and root) are what they always were."""

    transforms: tuple[Applied, ...] = ()


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_TransformedWire)


class Manifest:
    """An immutable, validated manifest. Build one with :meth:`build` or :meth:`decode`."""

    __slots__ = ("_encoded", "_rank_major", "digests", "layout", "root", "transforms")

    def __init__(
        self, layout: Layout, digests: Sequence[bytes], transforms: Sequence[Applied] = ()
    ) -> None:
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
        self.transforms = tuple(transforms)
        _check_transforms(layout, self.transforms)
        self._rank_major = {a.name: a for a in self.transforms if a.kind == "shard_major"}
        fields = (FORMAT, layout.chunk_size, layout.align, layout.total_bytes, layout.tensors)
        wire = (
            _TransformedWire(*fields, digests, self.transforms)
            if self.transforms
            else _ManifestWire(*fields, digests)
        )
        self._encoded = _encoder.encode(wire)
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
        manifest = cls(layout, wire.digests, wire.transforms)
        if expected_root is not None and manifest.root != expected_root:
            raise ManifestError(
                f"manifest root {manifest.root.hex()} != expected {bytes(expected_root).hex()}"
            )
        return manifest

    def applied(self, name: str) -> list[Applied]:
        """The transforms that produced published tensor ``name``, in the order applied."""
        return [a for a in self.transforms if a.name == name]

    def shard_major(self, name: str) -> Applied | None:
        """The shard_major record of ``name``, if it was published rank-major."""
        return self._rank_major.get(name)

    def logical_shape(self, spec: TensorSpec) -> tuple[int, ...]:
        """The shape tensor ``spec`` has for its readers: as published, but for a tensor
        published rank-major (``[world, ...]``, see :class:`tensorhub.transforms.ShardMajor`)
        the shape with its ``world`` blocks back along their dimension."""
        sm = self._rank_major.get(spec.name)
        if sm is None:
            return spec.shape
        rest = list(spec.shape[1:])
        rest[sm.dim] *= spec.shape[0]
        return tuple(rest)

    def __repr__(self) -> str:
        return (
            f"Manifest(root={self.root.hex()[:16]}…, tensors={len(self.tensors)}, "
            f"bytes={self.total_bytes}, chunks={self.num_chunks})"
        )


def _check_transforms(layout: Layout, transforms: Sequence[Applied]) -> None:
    """A record must name a published tensor and fit it (a reader undoes shard_major by
    these numbers: a wrong one would reshape bytes into the wrong tensor)."""
    specs = {t.name: t for t in layout.tensors}
    for a in transforms:
        if a.kind not in KINDS:
            raise ManifestError(f"transform {a.kind!r} on {a.name!r}: not one of {KINDS}")
        spec = specs.get(a.name)
        if spec is None:
            raise ManifestError(f"transform {a.kind!r} names {a.name!r}, not in the version")
        if a.kind == "shard_major":
            world = a.parts[0] if len(a.parts) == 1 else 0
            if world < 1 or spec.shape[:1] != (world,) or not 0 < a.dim < len(spec.shape) - 1:
                raise ManifestError(
                    f"shard_major {a.name!r}: shape {spec.shape} is not [{world}, ...] with a "
                    f"dimension {a.dim} > 0 to put the blocks back on"
                )

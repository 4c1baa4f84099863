from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorhub.core.digest import digest
from tensorhub.core.errors import ManifestError
from tensorhub.core.layout import TensorDesc, TensorSpec, plan_layout
from tensorhub.core.manifest import Manifest, _ManifestWire


def _manifest(n: int = 5) -> Manifest:
    lay = plan_layout(
        [TensorDesc(f"w{i}", "float32", (1000 * (i + 1),)) for i in range(n)]
        + [TensorDesc("tied", "float32", (1000,), "w0")],
        chunk_size=4096,
    )
    return Manifest(lay, [digest(bytes([i % 256]) * 7) for i in range(lay.num_chunks)])


def test_roundtrip_and_root_is_stable() -> None:
    m = _manifest()
    again = Manifest.decode(m.encode(), expected_root=m.root)
    assert again.root == m.root
    assert again.layout == m.layout
    assert again.digests == m.digests
    assert len(m.root) == 16


def test_root_commits_to_every_digest() -> None:
    m = _manifest()
    other = Manifest(m.layout, [*m.digests[:-1], digest(b"different")])
    assert other.root != m.root
    with pytest.raises(ManifestError, match="expected"):
        Manifest.decode(other.encode(), expected_root=m.root)


def _wire(m: Manifest) -> _ManifestWire:
    return msgspec.msgpack.decode(m.encode(), type=_ManifestWire)


def _reencode(w: _ManifestWire, **changes: object) -> bytes:
    return msgspec.msgpack.encode(msgspec.structs.replace(w, **changes))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ("format", "format"),
        ("total", "total_bytes"),
        ("offset", "canonical layout"),
        ("nbytes", "canonical layout"),
        ("digest_count", "chunk digests"),
        ("digest_len", "digest of"),
        ("chunk_size", "chunk_size"),
        ("dtype", "unsupported dtype"),
    ],
)
def test_inconsistent_manifests_are_refused(change: str, match: str) -> None:
    m = _manifest()
    w = _wire(m)
    t0 = w.tensors[1]
    bad = {
        "format": lambda: _reencode(w, format=2),
        "total": lambda: _reencode(w, total_bytes=w.total_bytes + 1),
        "offset": lambda: _reencode(
            w,
            tensors=(
                w.tensors[0],
                msgspec.structs.replace(t0, offset=t0.offset + 64),
                *w.tensors[2:],
            ),
        ),
        "nbytes": lambda: _reencode(
            w, tensors=(w.tensors[0], msgspec.structs.replace(t0, nbytes=4), *w.tensors[2:])
        ),
        "digest_count": lambda: _reencode(w, digests=w.digests[:-1]),
        "digest_len": lambda: _reencode(w, digests=(b"x", *w.digests[1:])),
        "chunk_size": lambda: _reencode(w, chunk_size=7),
        "dtype": lambda: _reencode(
            w, tensors=(TensorSpec("w0", "quint8", (1000,), 0, 4000), *w.tensors[1:])
        ),
    }[change]()
    with pytest.raises(ManifestError, match=match):
        Manifest.decode(bad)


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x90", b"garbage" * 10, b"\x96" + b"\x00" * 6])
def test_garbage_is_refused(data: bytes) -> None:
    with pytest.raises(ManifestError, match="malformed"):
        Manifest.decode(data)


def test_oversized_manifest_is_refused_before_parsing() -> None:
    with pytest.raises(ManifestError, match="exceeds"):
        Manifest.decode(memoryview(bytearray(257 << 20)))


@given(st.data())
def test_mutated_manifests_never_crash(data: st.DataObject) -> None:
    """Any corruption is either refused with ManifestError or is a self-consistent manifest
    with a different root (a fetcher that knows the committed root refuses it too)."""
    m = _manifest(3)
    raw = bytearray(m.encode())
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        i = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if op == "flip" and raw:
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "cut":
            del raw[i:]
        else:
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    try:
        got = Manifest.decode(bytes(raw))
    except ManifestError:
        return
    if bytes(raw) != m.encode():
        assert got.root != m.root or got.encode() == m.encode()

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorhub.core.dtypes import ITEMSIZE
from tensorhub.core.errors import ManifestError
from tensorhub.core.layout import PADDING, TensorDesc, plan_layout


def test_small_tensors_share_a_chunk() -> None:
    descs = [TensorDesc(f"t{i}", "float32", (3,)) for i in range(1000)]
    lay = plan_layout(descs, chunk_size=64 * 1024, align=16)
    # 1000 tensors of 12 bytes, 16-byte aligned: one chunk, not a thousand requests.
    assert lay.num_chunks == 1
    assert lay.total_bytes == 999 * 16 + 12


def test_big_tensor_spans_chunks_and_segments_cover_it() -> None:
    lay = plan_layout(
        [TensorDesc("a", "bfloat16", (10,)), TensorDesc("b", "float32", (5000,))],
        chunk_size=4096,
        align=64,
    )
    assert lay.tensors[1].offset == 64
    assert lay.num_chunks == -(-(64 + 20000) // 4096)
    segs = lay.segments(0)
    assert segs[0] == (0, 0, 20)
    assert segs[1] == (PADDING, 0, 44)
    assert segs[2] == (1, 0, 4096 - 64)
    assert list(lay.chunks_of(1)) == list(range(lay.num_chunks))


def test_alias_costs_no_bytes() -> None:
    lay = plan_layout(
        [TensorDesc("emb", "float16", (100, 8)), TensorDesc("head", "float16", (100, 8), "emb")],
        chunk_size=4096,
    )
    assert lay.total_bytes == 1600
    assert lay.tensors[1].offset == lay.tensors[0].offset


@pytest.mark.parametrize(
    ("descs", "match"),
    [
        ([TensorDesc("a", "float32", (1,)), TensorDesc("a", "float32", (1,))], "duplicate"),
        ([TensorDesc("", "float32", (1,))], "non-empty"),
        ([TensorDesc("a", "qint8", (1,))], "unsupported dtype"),
        ([TensorDesc("a", "float32", (-1,))], "bad shape"),
        ([TensorDesc("a", "float32", (1,), "b")], "alias_of"),
        (
            [TensorDesc("a", "float32", (2,)), TensorDesc("b", "float16", (2,), "a")],
            "different dtype",
        ),
    ],
)
def test_bad_descriptions_are_refused(descs: list[TensorDesc], match: str) -> None:
    with pytest.raises(ManifestError, match=match):
        plan_layout(descs)


@pytest.mark.parametrize(("chunk", "align"), [(100, 64), (1 << 30, 64), (4096, 3), (4096, 0)])
def test_bad_geometry_is_refused(chunk: int, align: int) -> None:
    with pytest.raises(ManifestError):
        plan_layout([], chunk_size=chunk, align=align)


def test_empty_layout_has_no_chunks() -> None:
    lay = plan_layout([TensorDesc("z", "float32", (0, 4))])
    assert lay.total_bytes == 0 and lay.num_chunks == 0
    with pytest.raises(IndexError):
        lay.chunk_range(0)


descs_strategy = st.lists(
    st.tuples(
        st.sampled_from(sorted(ITEMSIZE)),
        st.lists(st.integers(0, 40), min_size=0, max_size=3),
    ),
    max_size=30,
)


@given(descs_strategy, st.sampled_from([4096, 5000, 8192]), st.sampled_from([1, 8, 64, 256]))
def test_segments_tile_every_chunk_and_every_tensor(
    raw: list[tuple[str, list[int]]], chunk: int, align: int
) -> None:
    descs = [TensorDesc(f"t{i}", dt, tuple(shape)) for i, (dt, shape) in enumerate(raw)]
    lay = plan_layout(descs, chunk_size=chunk, align=align)
    covered: dict[int, int] = {}
    pos = 0
    for c in range(lay.num_chunks):
        start, end = lay.chunk_range(c)
        assert start == pos
        assert sum(s.length for s in lay.segments(c)) == end - start
        for s in lay.segments(c):
            assert s.length > 0
            if s.tensor == PADDING:
                assert s.length < align
                pos += s.length
                continue
            spec = lay.tensors[s.tensor]
            # Segments address bytes in order, inside the tensor, at the right flat position.
            assert spec.offset + s.start == pos
            assert s.start + s.length <= spec.nbytes
            assert covered.get(s.tensor, 0) == s.start
            covered[s.tensor] = s.start + s.length
            pos += s.length
        assert pos == end
    for i, spec in enumerate(lay.tensors):
        assert spec.offset % align == 0
        assert covered.get(i, 0) == spec.nbytes
        if spec.nbytes:
            assert all(any(s.tensor == i for s in lay.segments(c)) for c in lay.chunks_of(i))

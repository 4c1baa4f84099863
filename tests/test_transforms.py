"""Publish-time transforms: each one's result, its record, and a reader undoing it."""

from __future__ import annotations

import pytest
import torch

from tensorhub.core.errors import ManifestError
from tensorhub.core.manifest import Manifest
from tensorhub.io.tensors import TensorBytes, build_manifest
from tensorhub.transforms import (
    Cast,
    Fp8,
    Fuse,
    Rename,
    ShardMajor,
    apply,
    dequantize_fp8,
    logical,
    quantize_fp8,
)


def layer() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "l0.attn.q_proj.weight": torch.randn(8, 6, generator=g),
        "l0.attn.k_proj.weight": torch.randn(4, 6, generator=g),
        "l0.attn.v_proj.weight": torch.randn(4, 6, generator=g),
        "l0.attn.o_proj.weight": torch.randn(6, 8, generator=g),
        "l0.norm.weight": torch.randn(6, generator=g),
    }


def manifest_of(tensors: dict[str, torch.Tensor], records: list) -> Manifest:  # type: ignore[type-arg]
    m = build_manifest(TensorBytes.from_state_dict(tensors, 4096), records)
    return Manifest.decode(m.encode(), m.root)  # the records survive the wire, verified


def test_cast_and_rename_records_follow_the_tensor() -> None:
    sd = layer()
    out, recs = apply(sd, [Cast(torch.bfloat16), Rename(lambda n: n.replace("l0.", "layers.0."))])
    assert all(t.dtype == torch.bfloat16 for t in out.values())
    assert set(out) == {n.replace("l0.", "layers.0.") for n in sd}
    m = manifest_of(out, recs)
    cast = [a for a in m.transforms if a.kind == "cast"]
    assert {a.name for a in cast} == set(out)  # renamed along with their tensors
    assert all(a.dtype == "float32" for a in cast)
    assert sd["l0.norm.weight"].dtype == torch.float32  # the trainer's tensors untouched


def test_fuse_concatenates_siblings_and_rank_major_fuse_holds_each_ranks_rows() -> None:
    sd = layer()
    out, recs = apply(sd, [Fuse(("q_proj", "k_proj", "v_proj"), "qkv_proj")])
    qkv = out["l0.attn.qkv_proj.weight"]
    q, k, v = (sd[f"l0.attn.{p}_proj.weight"] for p in "qkv")
    assert torch.equal(qkv, torch.cat([q, k, v]))
    assert "l0.attn.q_proj.weight" not in out and "l0.attn.o_proj.weight" in out
    (rec,) = recs
    assert rec.parts == (8, 4, 4) and rec.sources[1] == "l0.attn.k_proj.weight"
    out2, _ = apply(sd, [Fuse(("q_proj", "k_proj", "v_proj"), "qkv_proj", world=2)])
    fused = out2["l0.attn.qkv_proj.weight"]
    for r in range(2):  # rank r's rows: [q_r; k_r; v_r], contiguous
        rows = fused[r * 8 : (r + 1) * 8]
        want = torch.cat([q[r * 4 : r * 4 + 4], k[r * 2 : r * 2 + 2], v[r * 2 : r * 2 + 2]])
        assert torch.equal(rows, want)


def test_shard_major_puts_each_ranks_columns_together_and_readers_undo_it() -> None:
    sd = layer()
    out, recs = apply(sd, [ShardMajor(r"o_proj", dim=1, world=4)])
    o = sd["l0.attn.o_proj.weight"]
    rm = out["l0.attn.o_proj.weight"]
    assert rm.shape == (4, 6, 2)
    for r in range(4):
        assert torch.equal(rm[r], o[:, 2 * r : 2 * r + 2])
    assert torch.equal(logical(rm, 1), o)
    m = manifest_of(out, recs)
    spec = next(t for t in m.tensors if t.name == "l0.attn.o_proj.weight")
    assert m.logical_shape(spec) == (6, 8)
    with pytest.raises(ManifestError, match="does not split"):
        apply(sd, [ShardMajor(r"o_proj", dim=1, world=3)])


@pytest.mark.parametrize("block", [None, (4, 4)])
def test_fp8_scales_dequantize_within_e4m3_precision(block: tuple[int, int] | None) -> None:
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(10, 12, generator=g) * torch.logspace(-3, 1, 12)).to(torch.bfloat16)
    out, recs = apply({"x.weight": w, "x.bias": torch.ones(10)}, [Fp8(block=block)])
    q = out["x.weight"]
    assert q.dtype == torch.float8_e4m3fn and out["x.bias"].dtype == torch.float32
    scale = out["x.weight_scale_inv" if block else "x.weight_scale"]
    back = dequantize_fp8(q, scale, block)
    # e4m3: 3 mantissa bits (relative step 2^-3, rounding error <= 2^-4), subnormals
    # below 2^-6 step by 2^-9 in scaled units.
    err = (back - w.float()).abs()
    if block is None:
        full = scale.expand(10, 12)
    else:
        full = scale.repeat_interleave(4, 0).repeat_interleave(4, 1)[:10, :12]
    bound = torch.maximum(w.float().abs() / 16, full * 2**-10) * 1.001
    assert bool((err <= bound).all())
    assert {a.name for a in recs} == {"x.weight", scale_name(block)}
    assert manifest_of(out, recs).transforms == tuple(recs)
    q2, s2 = quantize_fp8(w, block)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8)) and torch.equal(s2, scale)


def scale_name(block: tuple[int, int] | None) -> str:
    return "x.weight_scale_inv" if block else "x.weight_scale"


def test_a_record_that_does_not_fit_its_tensor_is_refused() -> None:
    from tensorhub.core.manifest import Applied

    t = {"w": torch.zeros(2, 3, 4)}
    data = TensorBytes.from_state_dict(t, 4096)
    with pytest.raises(ManifestError, match="not in the version"):
        build_manifest(data, [Applied("cast", "nope", ("nope",), "float32")])
    with pytest.raises(ManifestError, match="shard_major"):
        build_manifest(data, [Applied("shard_major", "w", ("w",), "", 1, (3,))])

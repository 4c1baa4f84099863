from __future__ import annotations

import warnings

import pytest
import torch

from tensorhub.core.digest import digest_parts
from tensorhub.core.errors import ManifestError
from tensorhub.io.tensors import TensorBytes, build_manifest, empty_like_manifest

from .models import awkward, every_dtype, same_bytes


def _copy(src: TensorBytes, dst: TensorBytes) -> None:
    """Move every chunk src → dst the way the network does: read parts into write parts."""
    for i in range(src.layout.num_chunks):
        data = b"".join(bytes(p) for p in src.read_parts(i))
        parts = dst.write_parts(i)
        pos = 0
        for p in parts:
            p[:] = data[pos : pos + len(p)]
            pos += len(p)
    dst.finalize()


@pytest.mark.parametrize("make", [every_dtype, awkward], ids=["every_dtype", "awkward"])
def test_bytes_roundtrip_bit_identical(make: object) -> None:
    sd = make()  # type: ignore[operator]
    src = TensorBytes.from_state_dict(sd, chunk_size=8192)
    m = build_manifest(src)
    into = empty_like_manifest(m)
    dst = TensorBytes.for_destination(m, into)
    _copy(src, dst)
    for i in range(m.num_chunks):
        assert digest_parts(dst.read_parts(i)) == m.digests[i]
    for k, t in sd.items():
        assert same_bytes(t, into[k]), k


def test_tied_weights_are_sent_once_and_stay_tied() -> None:
    sd = awkward()
    m = build_manifest(TensorBytes.from_state_dict(sd))
    by = {t.name: t for t in m.tensors}
    assert by["lm_head.weight"].alias_of == "embed.weight"
    # Bytes: embed once; base and its contiguous slice both (overlapping views are not deduped).
    into = empty_like_manifest(m)
    assert into["lm_head.weight"] is into["embed.weight"]


def test_non_contiguous_and_untied_destinations_are_filled() -> None:
    sd = awkward()
    src = TensorBytes.from_state_dict(sd, chunk_size=4096)
    m = build_manifest(src)
    into = {k: torch.zeros_like(v) for k, v in sd.items()}  # untied; keeps strides
    into["transposed"] = torch.zeros(300, 200).t()  # non-contiguous destination
    assert not into["transposed"].is_contiguous()
    _copy(src, TensorBytes.for_destination(m, into))
    for k, t in sd.items():
        assert same_bytes(t, into[k]), k


def test_destination_mismatches_are_refused_before_any_byte_moves() -> None:
    sd = {"a": torch.zeros(4), "b": torch.zeros(2, dtype=torch.int32)}
    m = build_manifest(TensorBytes.from_state_dict(sd))
    with pytest.raises(ManifestError, match=r"missing \['b'\]"):
        TensorBytes.for_destination(m, {"a": torch.zeros(4)})
    with pytest.raises(ManifestError, match=r"unexpected \['c'\]"):
        TensorBytes.for_destination(m, {**sd, "c": torch.zeros(1)})
    with pytest.raises(ManifestError, match=r"'a' is torch\.float16"):
        TensorBytes.for_destination(m, {"a": torch.zeros(4).half(), "b": sd["b"]})
    with pytest.raises(ManifestError, match=r"\(5,\)"):
        TensorBytes.for_destination(m, {"a": torch.zeros(5), "b": sd["b"]})


def test_unsupported_inputs_have_clear_errors() -> None:
    with pytest.raises(TypeError, match=r"not a torch\.Tensor"):
        TensorBytes.from_state_dict({"x": [1, 2]})  # type: ignore[dict-item]
    with pytest.raises(ManifestError, match="cannot be moved"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensors are deprecated in torch
            q = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)
        TensorBytes.from_state_dict({"q": q})

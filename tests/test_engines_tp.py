"""Tensor-parallel reads in vLLM's Llama layout: a trainer publishes an HF Llama once,
fused and rank-major for 2 ranks; each rank fetches only its share, straight into tensors
shaped as vLLM's rank-local parameters; the shares are what vLLM's own weight loaders
would have cut from the full tensors, and each rank moves about half the model."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from tensorhub.engines import hf
from tensorhub.engines.vllm import TensorHubWorker, llama_transforms, tp_slices

from .test_hub import cluster

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")

CONFIG = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "tie_word_embeddings": True,
}
CHUNK = 64 << 10
WORLD = 2


def vllm_rank_params(sd: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """What vLLM's LlamaForCausalLM holds on TP rank ``rank`` of 2, cut from the HF
    tensors the way its weight loaders cut them (QKVParallelLinear: q, k, v each narrowed
    on dim 0 then stacked; MergedColumnParallelLinear: gate, up likewise; RowParallelLinear:
    narrowed on dim 1; VocabParallelEmbedding: rows; norms whole; lm_head tied)."""

    def rows(t: torch.Tensor) -> torch.Tensor:
        n = t.shape[0] // WORLD
        return t[rank * n : (rank + 1) * n]

    def cols(t: torch.Tensor) -> torch.Tensor:
        n = t.shape[1] // WORLD
        return t[:, rank * n : (rank + 1) * n]

    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if name == "lm_head.weight":
            continue  # tied to the embedding: one parameter in vLLM
        if ".q_proj." in name:
            base = name.replace(".q_proj.", ".{}.")
            qkv = [rows(sd[base.format(p)]) for p in ("q_proj", "k_proj", "v_proj")]
            out[name.replace(".q_proj.", ".qkv_proj.")] = torch.cat(qkv)
        elif ".gate_proj." in name:
            base = name.replace(".gate_proj.", ".{}.")
            gu = [rows(sd[base.format(p)]) for p in ("gate_proj", "up_proj")]
            out[name.replace(".gate_proj.", ".gate_up_proj.")] = torch.cat(gu)
        elif any(f".{p}." in name for p in ("k_proj", "v_proj", "up_proj")):
            continue
        elif ".o_proj." in name or ".down_proj." in name:
            out[name] = cols(t)
        elif "embed_tokens" in name:
            out[name] = rows(t)
        else:
            out[name] = t
    return out


async def test_two_tp_ranks_fetch_their_shares_in_vllms_layout(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).to(torch.bfloat16)
    sd = hf.tensors(model)
    async with cluster(tmp_path, rollouts=WORLD) as (voters, ranks):
        pub = await voters[0].publish(
            "llama", 1, sd, chunk_size=CHUNK, transforms=llama_transforms(WORLD)
        )
        total = pub.manifest.total_bytes
        moved = []
        for rank, hub in enumerate(ranks):
            want = vllm_rank_params(sd, rank)
            into = {n: torch.empty_like(t) for n, t in want.items()}
            slices = tp_slices(pub.manifest, rank, WORLD, into)
            res = await hub.fetch_slices("llama", 1, into, slices)
            for n, t in want.items():
                assert torch.equal(into[n], t), f"rank {rank}: {n}"
            moved.append(res.bytes)
        share = [m / total for m in moved]
        print(f"model {total / 2**20:.1f} MiB in {CHUNK >> 10} KiB chunks; per rank {share}")
        assert all(s < 0.6 for s in share), share  # about half: whole chunks at the edges


def test_a_worker_takes_its_tp_rank_from_vllm_not_its_global_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The TP rank and size come from vLLM's parallel state (stood in for here), whatever
    the global rank and however the groups are laid out; no world need be passed."""
    worker = TensorHubWorker()
    worker.rank = 5  # 5 % 4 would be 1
    fake = types.ModuleType("vllm.distributed")
    fake.get_tensor_model_parallel_rank = lambda: 3  # type: ignore[attr-defined]
    fake.get_tensor_model_parallel_world_size = lambda: 4  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.distributed", fake)
    assert worker._tp_rank(None) == (3, 4)
    assert worker._tp_rank(4) == (3, 4)
    with pytest.raises(ValueError, match="TP-4"):
        worker._tp_rank(8)  # a share published for 8 ranks does not fit vLLM's 4


def test_without_vllm_the_global_rank_stands_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import fails, as where it is absent
    worker = TensorHubWorker()
    worker.rank = 5
    assert worker._tp_rank(4) == (1, 4)
    with pytest.raises(ValueError, match="pass world"):
        worker._tp_rank(None)

"""vLLM and SGLang, for real: run where the engine and a CUDA GPU exist, skipped (with the
reason) elsewhere. A trainer publishes a tiny HF Llama built from a config; the engine
loads it from tensorhub through its own entry points and generates greedily the same
tokens as transformers does with the trainer's weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tensorhub import SyncHub
from tensorhub.engines import hf
from tensorhub.testing.hub_procs import SECRET, HubProcs, Spec

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: vLLM and SGLang need one", allow_module_level=True)

CONFIG = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "tie_word_embeddings": True,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
PROMPT = [1, 17, 401, 99, 5]


def trainer_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**CONFIG)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def greedy(model: torch.nn.Module) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False, eos_token_id=None
        )
    return out[0, len(PROMPT) :].tolist()


def cluster(tmp: Path) -> HubProcs:
    return HubProcs([Spec(f"v{i}", f"dc0/rack0/v{i}", voter=True) for i in range(3)], str(tmp))


def checkpoint(tmp: Path) -> Path:
    """An HF checkpoint directory with other weights than the trainer's (the engine must
    get the trainer's from tensorhub to match)."""
    path = tmp / "llama"
    trainer_model(seed=999).save_pretrained(path)
    return path


@pytest.mark.timeout(900)
def test_vllm_loads_versions_through_its_worker_extension(tmp_path: Path) -> None:
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed")
    with cluster(tmp_path) as c:
        seeds = list(c.addr.values())
        trainer = trainer_model(seed=0)
        with SyncHub(name="trainer", locality="dc0/rack1/t", seeds=seeds, secret=SECRET) as hub:
            hub.publish("llama", 1, hf.tensors(trainer))
            llm = vllm.LLM(
                model=str(checkpoint(tmp_path)),
                skip_tokenizer_init=True,
                enforce_eager=True,
                dtype="bfloat16",
                gpu_memory_utilization=0.3,
                worker_extension_cls="tensorhub.engines.vllm.TensorHubWorker",
            )
            llm.collective_rpc("tensorhub_join", args=(seeds, SECRET, "dc0/rack2"))
            llm.collective_rpc("tensorhub_load", args=("llama", 1))
            params = vllm.SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
            out = llm.generate({"prompt_token_ids": PROMPT}, params)
            assert list(out[0].outputs[0].token_ids) == greedy(trainer)
            assert llm.collective_rpc("tensorhub_version") == [("llama", 1)]


@pytest.mark.timeout(900)
def test_sglang_loads_a_version_through_update_weights_from_tensor(tmp_path: Path) -> None:
    sgl = pytest.importorskip("sglang", reason="SGLang is not installed")
    from tensorhub.engines import sglang as adapter

    with cluster(tmp_path) as c:
        seeds = list(c.addr.values())
        trainer = trainer_model(seed=0)
        with SyncHub(name="trainer", locality="dc0/rack1/t", seeds=seeds, secret=SECRET) as hub:
            hub.publish("llama", 1, hf.tensors(trainer))
            engine = sgl.Engine(
                model_path=str(checkpoint(tmp_path)),
                skip_tokenizer_init=True,
                mem_fraction_static=0.3,
            )
            try:
                with SyncHub(
                    name="sglang", locality="dc0/rack2/s", seeds=seeds, secret=SECRET
                ) as rollout:
                    loaded = adapter.load(engine, rollout, "llama", 1, bucket_bytes=1 << 20)
                assert loaded.buckets > 1
                out = engine.generate(
                    input_ids=PROMPT,
                    sampling_params={"temperature": 0, "max_new_tokens": 16, "ignore_eos": True},
                )
                assert out["output_ids"] == greedy(trainer)
            finally:
                engine.shutdown()

"""A vLLM rollout that loads every new tensorhub version through vLLM's own workers.

Needs a CUDA GPU and ``pip install vllm``. Pair it with ``hf_trainer.py`` (same model
config, saved here as an HF checkpoint vLLM can start from):

    python examples/hf_trainer.py --listen 127.0.0.1:7400 --steps 5 --linger 300
    python examples/vllm_rollout.py --seed 127.0.0.1:7400 --tp 1
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from hf_trainer import CONFIG, SECRET
from transformers import LlamaForCausalLM
from vllm import LLM, SamplingParams

from tensorhub import SyncHub


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", default="127.0.0.1:7400")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--versions", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as path:
        LlamaForCausalLM(CONFIG).to(torch.bfloat16).save_pretrained(path)  # the architecture
        llm = LLM(
            model=path,
            skip_tokenizer_init=True,
            tensor_parallel_size=args.tp,
            worker_extension_cls="tensorhub.engines.vllm.TensorHubWorker",
        )
        llm.collective_rpc("tensorhub_join", args=([args.seed], SECRET, "dc0/rack2"))
        params = SamplingParams(temperature=0, max_tokens=16)
        with SyncHub(name="vllm-watch", seeds=[args.seed], secret=SECRET) as hub:
            for v in hub.watch("llama", timeout=600):
                llm.collective_rpc("tensorhub_load", args=("llama", v))
                out = llm.generate({"prompt_token_ids": [1, 42, 7, 99]}, params)
                print(f"v{v}: {list(out[0].outputs[0].token_ids)}", flush=True)
                if v >= args.versions:
                    return


if __name__ == "__main__":
    main()

"""A trainer that publishes an HF Llama after every optimizer step.

Builds a small Llama from a config (nothing downloaded), is the cluster's single Raft voter
(a real deployment runs 3 or 5), and publishes a version per step, cast from fp32 masters to
bf16 at publish (a transform the manifest records). A version's buffers are the trainer's
own until ``unpublish`` returns; here the cast makes a bf16 copy that tensorhub owns, so
the trainer steps on at once and lets go of each version when the next one is out.

    python examples/hf_trainer.py --listen 127.0.0.1:7400 --steps 5
    python examples/hf_rollout.py --seed 127.0.0.1:7400        # in another shell

Both need transformers (``pip install transformers``; ``make test`` installs it).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tensorhub import SyncHub
from tensorhub.engines import hf
from tensorhub.transforms import Cast

CONFIG = LlamaConfig(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    tie_word_embeddings=True,
)
SECRET = "examples-secret"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:7400")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--linger", type=float, default=30.0, help="seconds to serve at the end")
    args = ap.parse_args()

    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIG)  # fp32 masters
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    batch = torch.randint(0, CONFIG.vocab_size, (4, 64))
    with (
        tempfile.TemporaryDirectory() as data_dir,
        SyncHub(
            name="trainer",
            locality="dc0/rack0/trainer",
            listen=args.listen,
            seeds=[args.listen],
            voter=True,
            data_dir=data_dir,
            secret=SECRET,
        ) as hub,
    ):
        print(f"trainer at {hub.address}", flush=True)
        for step in range(1, args.steps + 1):
            loss = model(batch, labels=batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            pub = hub.publish("llama", step, hf.tensors(model), transforms=[Cast(torch.bfloat16)])
            size = pub.manifest.total_bytes / 2**20
            print(f"step {step}: loss {loss.item():.4f}, published v{step} ({size:.0f} MiB bf16)")
            if step > 1:  # the bf16 copy is tensorhub's, so the trainer never waits on it
                hub.unpublish("llama", step - 1)
        print("serving the last version; Ctrl-C to stop", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(args.linger)


if __name__ == "__main__":
    main()

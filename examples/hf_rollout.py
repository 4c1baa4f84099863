"""A rollout that loads every new version into its own HF model in place, and generates.

Joins the cluster through any seed, watches the committed versions, and streams each one
into the model bucket by bucket (extra memory: one bucket, not a second model). With
``--atomic`` it stages the version first and swaps only once every byte verified, so a
failed fetch leaves the previous version serving.

    python examples/hf_rollout.py --seed 127.0.0.1:7400 --versions 5
"""

from __future__ import annotations

import argparse

import torch
from hf_trainer import CONFIG, SECRET
from transformers import LlamaForCausalLM

from tensorhub import SyncHub, TensorHubError
from tensorhub.engines import StagedWeights, hf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", default="127.0.0.1:7400")
    ap.add_argument("--versions", type=int, default=5, help="stop after this version")
    ap.add_argument("--bucket-mib", type=int, default=16)
    ap.add_argument("--atomic", action="store_true")
    args = ap.parse_args()

    model = LlamaForCausalLM(CONFIG).to(torch.bfloat16).eval()
    staged = StagedWeights(hf.tensors(model)) if args.atomic else None
    prompt = torch.tensor([[1, 42, 7, 99]])
    with SyncHub(
        name="rollout", locality="dc0/rack1/rollout", seeds=[args.seed], secret=SECRET
    ) as hub:
        for v in hub.watch("llama", timeout=600):
            try:
                how = load(hub, v, model, staged, args.bucket_mib << 20)
            except TensorHubError as e:
                if hub.latest("llama") <= v:
                    raise
                # The trainer let go of v once v+1 was out: load the newer one instead.
                print(f"v{v} superseded while loading ({type(e).__name__}); moving on")
                continue
            with torch.no_grad():
                out = model.generate(prompt, max_new_tokens=8, do_sample=False)
            print(f"v{v} loaded ({how}); greedy: {out[0, 4:].tolist()}", flush=True)
            if v >= args.versions:
                return


def load(
    hub: SyncHub,
    v: int,
    model: torch.nn.Module,
    staged: StagedWeights | None,
    bucket_bytes: int,
) -> str:
    if staged is not None:  # all or nothing: a failure leaves the previous version live
        res = staged.update_sync(hub, "llama", v)
        return f"staged, {res.bytes / 2**20:.0f} MiB in {res.seconds:.2f}s"
    rep = hf.load_sync(hub, "llama", v, model, bucket_bytes=bucket_bytes)
    return f"{rep.buckets} buckets, largest {rep.largest_bucket / 2**20:.1f} MiB"


if __name__ == "__main__":
    main()

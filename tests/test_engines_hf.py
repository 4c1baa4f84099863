"""HF transformers through tensorhub: a trainer publishes a Llama built from a config, a
rollout in another process streams it into its own model in place, with extra memory of
one bucket, and generates the same tokens."""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from pathlib import Path

import pytest
import torch

from tensorhub.engines import hf
from tensorhub.io.loop import run

from .test_hub import SECRET, cluster

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")

CONFIG = {
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "tie_word_embeddings": True,
    "max_position_embeddings": 256,
}
PROMPT = [1, 17, 401, 99, 5]
BUCKET = 10 << 20
ROOT = Path(__file__).resolve().parent.parent


def trainer_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**CONFIG)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def test_tied_weights_travel_once_and_buffers_only_when_asked() -> None:
    model = trainer_model(0)
    sd = hf.tensors(model)
    assert sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()
    assert not any("inv_freq" in n for n in sd)  # non-persistent: derived from the config
    assert any("inv_freq" in n for n in hf.tensors(model, buffers=True))


@pytest.mark.timeout(300)
def test_a_rollout_streams_a_version_into_its_model_and_generates_the_same(tmp_path: Path) -> None:
    """Once, on the default loop (it is a multi-process test: the loop is not what it tests)."""
    run(_stream_into_a_rollout(tmp_path))


async def _stream_into_a_rollout(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    async with cluster(tmp_path, rollouts=0) as (voters, _):
        model = trainer_model(0).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        want: list[tuple[list[int], float]] = []
        for v in (1, 2):
            if v == 2:  # one optimizer step: every weight moves
                batch = torch.randint(0, CONFIG["vocab_size"], (2, 16))
                model(batch, labels=batch).loss.backward()
                opt.step()
            # A snapshot per version (ties kept): the trainer steps on, and a version's
            # tensors must not change while it is served.
            snap = copy.deepcopy(model).eval()
            pub = await voters[0].publish("llama", v, hf.tensors(snap), chunk_size=1 << 20)
            with torch.no_grad():
                out = snap.generate(torch.tensor([PROMPT]), max_new_tokens=24, do_sample=False)
                logits = snap(torch.tensor([PROMPT])).logits.float().sum().item()
            want.append((out[0].tolist(), logits))
        args = {
            "seeds": [v.address for v in voters],
            "secret": SECRET,
            "config": CONFIG,
            "model": "llama",
            "versions": [1, 2],
            "bucket_bytes": BUCKET,
            "prompt": PROMPT,
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.hf_rollout_proc",
            json.dumps(args),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        out_b, _ = await asyncio.wait_for(proc.communicate(), 240)
        assert proc.returncode == 0, "the rollout process failed (its traceback is above)"
        loads = json.loads(out_b.decode().strip().splitlines()[-1])
        size = pub.manifest.total_bytes
        for got in loads:
            print(
                f"v{got['version']}: model {size / 2**20:.1f} MiB, bucket "
                f"{BUCKET / 2**20:.0f} MiB, {got['buckets']} buckets (largest "
                f"{got['largest_bucket'] / 2**20:.1f} MiB), peak extra RSS "
                f"{got['peak_extra'] / 2**20:.2f} MiB"
            )
        assert [(g["tokens"], g["logits"]) for g in loads] == want
        assert want[0] != want[1]  # the step changed what the model says
        assert all(g["buckets"] > 3 for g in loads)
        # The second load is every later step's cost: one bucket's buffer (plus the read's
        # bookkeeping: 12 KiB measured), not a second model. (The first also pays the
        # process's first fetch: executor threads, code paths run once.)
        assert loads[1]["peak_extra"] <= BUCKET + (64 << 10), loads[1]["peak_extra"]
        assert loads[0]["peak_extra"] <= BUCKET + (2 << 20), loads[0]["peak_extra"]


def test_a_version_that_does_not_fit_the_model_is_refused_before_a_byte_moves() -> None:
    from tensorhub.core.errors import ManifestError
    from tensorhub.io.tensors import TensorBytes, build_manifest

    def llama(**change: int) -> torch.nn.Module:
        small = {**CONFIG, "num_hidden_layers": 1, "vocab_size": 1024, **change}
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**small))

    manifest = build_manifest(TensorBytes.from_state_dict(hf.tensors(llama())))
    hf.check(manifest, hf.tensors(llama()))  # the same config fits
    with pytest.raises(ManifestError, match="shapes"):
        hf.check(manifest, hf.tensors(llama(intermediate_size=1024)))

"""How small is the delta between consecutive versions? Measured on real training.

Issue #21's first question, before any delta travels: for models trained with AdamW at
RL-like learning rates, with fp32 master weights and a bf16 published copy (what a trainer
publishes, and what the demo's ``rollout_weights`` and an HF cast produce), how many
published elements change per step, and how small do the changes encode?

Two models, built here (nothing downloaded): the demo's TinyLM on its synthetic task, and
a Llama from a config (random tokens). For each step's pair of published versions (v-1,
v), per 4 MiB chunk of the published bytes, in the same run:

- **changed**: the fraction of 16-bit words whose bits changed;
- **xor+zstd**, **xor+lz4**: the XOR of the two chunks, compressed (zstd level 3, lz4 frame);
- **sparse**: the changed words' positions (gaps, uint32) and new values (uint16), zstd'd;
- **best**: per chunk the smallest of those or the raw chunk (what a per-chunk choice sends);
- **full+zstd**: v's chunk alone compressed (what compression without a base saves).

Sizes are fractions of the model's published bytes. Encode and decode speeds are GB/s of
model bytes for the per-chunk choice, beside a memcpy of the same chunks in the same run.
Every decode is checked to give v's bytes back exactly.

    python bench/deltas.py --json docs/results/deltas.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lz4.frame  # type: ignore[import-untyped]
import numpy as np
import torch
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench.common import machine, median, print_table, write_json
from tensorhub.core.delta import LEVEL, decode_chunk, xor_zstd
from tensorhub.demo.model import (
    TinyLM,
    TinyLMConfig,
    rollout_weights,
    synthetic_batch,
    train_step,
)

CHUNK = 4 << 20
ENCODINGS = ("xor+zstd", "xor+lz4", "sparse")


def _published_bytes(weights: dict[str, torch.Tensor]) -> np.ndarray:
    """The version's bytes, tensor after tensor in name order (the manifest's order)."""
    parts = [weights[n].contiguous().reshape(-1).view(torch.uint8).numpy() for n in sorted(weights)]
    return np.concatenate(parts)


def _sparse(base: np.ndarray, new: np.ndarray, z: zstandard.ZstdCompressor) -> bytes:
    a, b = base.view(np.uint16), new.view(np.uint16)
    idx = np.flatnonzero(a != b).astype(np.uint32)
    gaps = np.diff(idx, prepend=np.uint32(0)).astype(np.uint32)
    return z.compress(np.uint32(len(idx)).tobytes() + gaps.tobytes() + b[idx].tobytes())


def _unsparse(base: np.ndarray, blob: bytes, d: zstandard.ZstdDecompressor) -> np.ndarray:
    raw = d.decompress(blob)
    n = int(np.frombuffer(raw[:4], np.uint32)[0])
    gaps = np.frombuffer(raw[4 : 4 + 4 * n], np.uint32)
    vals = np.frombuffer(raw[4 + 4 * n :], np.uint16)
    out = base.copy().view(np.uint16)
    out[np.cumsum(gaps, dtype=np.uint64).astype(np.int64)] = vals
    return out.view(np.uint8)


@dataclass
class PairResult:
    changed: float
    sizes: dict[str, float]  # encoding -> bytes / model bytes
    best: float
    full_zstd: float
    choice: dict[str, int]  # encoding -> chunks it won
    encode_gbps_each: dict[str, float]  # encoding -> GB/s of model bytes
    encode_gbps: float
    decode_gbps: float
    memcpy_gbps: float


def measure_pair(base: np.ndarray, new: np.ndarray) -> PairResult:
    """Every encoding of every chunk of ``new`` against ``base``, timed and checked."""
    z, d = zstandard.ZstdCompressor(level=LEVEL), zstandard.ZstdDecompressor()
    total = len(new)
    sizes = dict.fromkeys(ENCODINGS, 0)
    best = full = 0
    choice = dict.fromkeys((*ENCODINGS, "raw"), 0)
    dec_s = copy_s = 0.0
    enc_each = dict.fromkeys(ENCODINGS, 0.0)
    scratch = np.empty(CHUNK, np.uint8)
    encoders: dict[str, Callable[[np.ndarray, np.ndarray], bytes]] = {
        "xor+zstd": lambda a, b: xor_zstd(a, b, z),  # the codec deltas travel in
        "xor+lz4": lambda a, b: lz4.frame.compress(np.bitwise_xor(a, b).tobytes()),
        "sparse": lambda a, b: _sparse(a, b, z),
    }
    decoders: dict[str, Callable[[np.ndarray, bytes], np.ndarray]] = {
        "xor+zstd": lambda a, blob: decode_chunk(a, blob, d),
        "xor+lz4": lambda a, blob: np.bitwise_xor(
            a, np.frombuffer(lz4.frame.decompress(blob), np.uint8)
        ),
        "sparse": lambda a, blob: _unsparse(a, blob, d),
    }
    changed = 0
    for at in range(0, total, CHUNK):
        a, b = base[at : at + CHUNK], new[at : at + CHUNK]
        changed += int(np.count_nonzero(a.view(np.uint16) != b.view(np.uint16)))
        t = time.perf_counter()
        np.copyto(scratch[: len(b)], b)
        copy_s += time.perf_counter() - t
        blobs = {}
        for name, enc in encoders.items():
            t = time.perf_counter()
            blobs[name] = enc(a, b)
            enc_each[name] += time.perf_counter() - t
            sizes[name] += len(blobs[name])
        full += len(z.compress(b.tobytes()))
        pick = min(blobs, key=lambda n: len(blobs[n]))
        if len(blobs[pick]) >= len(b):
            choice["raw"] += 1
            best += len(b)
            continue
        choice[pick] += 1
        best += len(blobs[pick])
        t = time.perf_counter()
        got = decoders[pick](a, blobs[pick])
        dec_s += time.perf_counter() - t
        if not np.array_equal(got, b):
            raise AssertionError(f"{pick} did not give the chunk at {at} back")
    # Encoding cost is what the per-chunk choice needs: every encoder tried on every chunk.
    return PairResult(
        changed / (total / 2),
        {n: s / total for n, s in sizes.items()},
        best / total,
        full / total,
        choice,
        {n: total / t / 1e9 for n, t in enc_each.items()},
        total / sum(enc_each.values()) / 1e9,
        total / max(dec_s, 1e-9) / 1e9,
        total / copy_s / 1e9,
    )


def _tiny(steps: int, lr: float, seed: int) -> list[np.ndarray]:
    torch.manual_seed(seed)
    cfg = TinyLMConfig()
    model = TinyLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    versions = [_published_bytes(rollout_weights(model))]
    for _ in range(steps):
        train_step(model, opt, synthetic_batch(cfg, g))
        versions.append(_published_bytes(rollout_weights(model)))
    return versions


def _llama(steps: int, lr: float, seed: int) -> list[np.ndarray]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)  # fp32 master weights
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)

    def published() -> np.ndarray:
        return _published_bytes(
            {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}
        )

    versions = [published()]
    for _ in range(steps):
        tokens = torch.randint(0, cfg.vocab_size, (4, 65), generator=g)
        loss = model(input_ids=tokens[:, :-1], labels=tokens[:, :-1]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        versions.append(published())
    return versions


MODELS: dict[str, Callable[[int, float, int], list[np.ndarray]]] = {
    "demo TinyLM": _tiny,
    "Llama (config)": _llama,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=4, help="AdamW steps per model and rate")
    ap.add_argument("--lrs", default="1e-6,1e-5", help="learning rates, comma-separated")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    print(f"[seed] bench/deltas.py --seed {args.seed}")
    rows: list[list[object]] = []
    results: list[dict[str, Any]] = []
    for model, train in MODELS.items():
        for lr in (float(x) for x in args.lrs.split(",")):
            versions = train(args.steps, lr, args.seed)
            pairs = [measure_pair(a, b) for a, b in itertools.pairwise(versions)]
            mb = len(versions[0]) / 2**20
            results.append({
                "model": model, "lr": lr, "model_mib": round(mb, 2),
                "pairs": [vars(p) for p in pairs],
            })  # fmt: skip
            rows.append([
                f"{'tiny' if model.startswith('demo') else 'llama'} {lr:g}", f"{mb:.0f}",
                f"{100 * median([p.changed for p in pairs]):.1f}",
                *(f"{100 * median([p.sizes[e] for p in pairs]):.1f}" for e in ENCODINGS),
                f"{100 * median([p.best for p in pairs]):.1f}",
                f"{100 * median([p.full_zstd for p in pairs]):.0f}",
                *(f"{median([p.encode_gbps_each[e] for p in pairs]):.2f}" for e in ENCODINGS),
                f"{median([p.decode_gbps for p in pairs]):.2f}",
                f"{median([p.memcpy_gbps for p in pairs]):.1f}",
            ])  # fmt: skip
    print_table(
        f"deltas between consecutive versions, median of {args.steps} steps: sizes in % of "
        "the model's published bytes, speeds in GB/s of model bytes (one core)",
        ["model lr", "MiB", "changed", *ENCODINGS, "best", "no base",
         *(f"{e.split('+')[-1]} GB/s" for e in ENCODINGS), "decode", "memcpy"],
        rows,
    )  # fmt: skip
    write_json(args.json, {"machine": machine(), "seed": args.seed, "steps": args.steps,
                           "chunk": CHUNK, "results": results})  # fmt: skip


if __name__ == "__main__":
    main()

"""Bytes a tensor-parallel rank moves to load its share, at real model shapes.

A rank's read (:meth:`Hub.fetch_slices`) moves whole chunks: every byte it needs is
verified against the committed chunk digests, so a share that starts or ends inside a
chunk costs the rest of that chunk too. This counts, with the planning code the read runs
(no transfer), the bytes of the chunks each rank of a Llama-3-8B / 70B published with
``llama_transforms(world)`` (vLLM's layout) needs, as a ratio to its ideal share
(1/world of the model), per chunk size.

    python bench/tp_share.py --json out.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import print_table, write_json
from tensorhub.core.buckets import chunks_for
from tensorhub.core.layout import TensorDesc, plan_layout
from tensorhub.core.manifest import Applied, Manifest
from tensorhub.engines.vllm import tp_slices
from tensorhub.reads import plan_read

SHAPES = {  # hidden, intermediate, layers, q heads, kv heads, head dim, vocab
    "llama3-8b": (4096, 14336, 32, 32, 8, 128, 128256),
    "llama3-70b": (8192, 28672, 80, 64, 8, 128, 128256),
}


def manifest(shape: tuple[int, ...], world: int, chunk: int) -> Manifest:
    """The version as llama_transforms(world) publishes it (digests are placeholders:
    only the layout is counted)."""
    h, inter, layers, nq, nkv, hd, vocab = shape
    descs = [TensorDesc("model.embed_tokens.weight", "bfloat16", (vocab, h))]
    recs = []
    for i in range(layers):
        p = f"model.layers.{i}."
        o, down = p + "self_attn.o_proj.weight", p + "mlp.down_proj.weight"
        descs += [
            TensorDesc(p + "input_layernorm.weight", "bfloat16", (h,)),
            TensorDesc(p + "self_attn.qkv_proj.weight", "bfloat16", ((nq + 2 * nkv) * hd, h)),
            TensorDesc(o, "bfloat16", (world, h, nq * hd // world)),
            TensorDesc(p + "post_attention_layernorm.weight", "bfloat16", (h,)),
            TensorDesc(p + "mlp.gate_up_proj.weight", "bfloat16", (2 * inter, h)),
            TensorDesc(down, "bfloat16", (world, h, inter // world)),
        ]
        recs += [Applied("shard_major", n, (n,), "", 1, (world,)) for n in (o, down)]
    descs += [
        TensorDesc("model.norm.weight", "bfloat16", (h,)),
        TensorDesc("lm_head.weight", "bfloat16", (vocab, h)),
    ]
    layout = plan_layout(descs, chunk)
    return Manifest(layout, [bytes(16)] * layout.num_chunks, recs)


def worst_share(m: Manifest, world: int) -> float:
    """The largest fraction of the model any rank moves."""
    specs = {t.name: t for t in m.tensors}
    worst = 0.0
    for rank in range(world):
        slices = tp_slices(m, rank, world)
        ranges = {}
        for name, spec in specs.items():
            r = plan_read(m, spec, slices.get(name))
            ranges[name] = (r.start, r.end)
        need = chunks_for(ranges, m.layout.chunk_size)
        moved = sum(m.layout.chunk_len(c) for c in need)
        worst = max(worst, moved / m.total_bytes)
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    args = ap.parse_args()
    rows, out = [], []
    for model, shape in SHAPES.items():
        for world in (2, 4, 8):
            for chunk_mib in (1, 4, 16):
                share = worst_share(manifest(shape, world, chunk_mib << 20), world)
                ratio = share * world
                rows.append([model, world, chunk_mib, f"{share:.4f}", f"{ratio:.3f}"])
                out.append(
                    {
                        "model": model,
                        "world": world,
                        "chunk_mib": chunk_mib,
                        "share": share,
                        "over_ideal": ratio,
                    }
                )
    print_table(
        "Bytes per tensor-parallel rank (worst rank), vLLM layout",
        ["model", "world", "chunk MiB", "share of model", "x ideal (1/world)"],
        rows,
    )
    if args.json:
        write_json(args.json, {"rows": out})


if __name__ == "__main__":
    main()

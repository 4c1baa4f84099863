"""Two processes, real weights: a trainer publishes versions, a rollout fetches each one.

The trainer process trains :class:`~tensorhub.demo.model.TinyLM` with real gradient steps
and serves each version's weights (bf16 matrices, fp32 norms, an int64 counter, a tied
head) from its own memory. The rollout process fetches every version over tensorhub's
authenticated TCP transport straight into preallocated tensors, checks per-tensor digests
against the trainer's, loads the weights and generates tokens with them. The parent only
relays "version v is at address A with root R" (the job Raft and gossip take over later)
and prints the summary.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from ..dataplane.node import Node
from ..io.loop import run
from ..io.tensors import empty_like_manifest, tensor_digests
from .model import (
    TinyLM,
    TinyLMConfig,
    load_rollout_weights,
    rollout_weights,
    synthetic_batch,
    train_step,
)

MODEL = "policy"


def trainer_main(versions: int, steps: int, secret: str, out: Any, ctl: Any) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)

    async def main() -> None:
        node = await Node.start("trainer", secret=secret)
        loop = asyncio.get_running_loop()
        for v in range(1, versions + 1):
            out.put({"event": "training", "version": v, "steps": steps})
            t0 = time.perf_counter()
            loss = sum(train_step(model, opt, synthetic_batch(model.cfg, g)) for _ in range(steps))
            t1 = time.perf_counter()
            weights = rollout_weights(model)
            manifest = node.serve(MODEL, v, weights)
            t2 = time.perf_counter()
            out.put(
                {
                    "event": "published",
                    "version": v,
                    "address": node.address,
                    "root": manifest.root.hex(),
                    "loss": loss / steps,
                    "train_s": t1 - t0,
                    "publish_s": t2 - t1,
                    "bytes": manifest.total_bytes,
                    "chunks": manifest.num_chunks,
                    "tensors": len(manifest.tensors),
                    "digests": tensor_digests(weights),
                }
            )
            # Wait until the rollout has the version, then withdraw it: from here on the
            # trainer could reuse that memory (the mutability contract).
            await loop.run_in_executor(None, ctl.get)
            t3 = time.perf_counter()
            await node.withdraw(MODEL, v)
            out.put({"event": "withdrawn", "version": v, "stall_s": time.perf_counter() - t3})
        await node.close()

    run(main())


def rollout_main(secret: str, inbox: Any, out: Any) -> None:
    torch.set_num_threads(1)
    model = TinyLM()
    prompt = torch.tensor([[5, 6, 7, 8]])

    async def main() -> None:
        node = await Node.start("rollout", secret=secret)
        loop = asyncio.get_running_loop()
        into: dict[str, torch.Tensor] | None = None
        while (msg := await loop.run_in_executor(None, inbox.get)) is not None:
            root = bytes.fromhex(msg["root"])
            if into is None:  # register once, transfer many: the buffers are reused
                peer = await node.peer(msg["address"])
                into = empty_like_manifest(await peer.get_manifest(MODEL, msg["version"], root))
            r = await node.fetch(
                msg["address"], MODEL, msg["version"], into, expected_root=root, hold=False
            )
            t0 = time.perf_counter()
            load_rollout_weights(model, into)
            sample = model.generate(prompt, 8)[0, 4:].tolist()
            out.put(
                {
                    "event": "fetched",
                    "version": msg["version"],
                    "fetch_s": r.seconds,
                    "gbps": r.gbps,
                    "digests": tensor_digests(into),
                    "sample": sample,
                    "infer_s": time.perf_counter() - t0,
                }
            )
        await node.close()

    run(main())


def main(versions: int = 3, steps: int = 20) -> int:
    secret = os.environ.get("TENSORHUB_SECRET") or os.urandom(16).hex()
    ctx = mp.get_context("spawn")
    out, ctl, inbox = ctx.Queue(), ctx.Queue(), ctx.Queue()
    console = Console()
    cfg = TinyLMConfig()
    console.print(
        f"[bold]tensorhub demo[/]: trainer and rollout as two processes; TinyLM "
        f"({cfg.layers} layers, dim {cfg.dim}, vocab {cfg.vocab}), {versions} versions, "
        f"{steps} training steps each"
    )
    trainer = ctx.Process(target=trainer_main, args=(versions, steps, secret, out, ctl))
    rollout = ctx.Process(target=rollout_main, args=(secret, inbox, out))
    trainer.start()
    rollout.start()
    console.print("  starting the trainer and the rollout processes (each imports torch)…")
    rows: dict[int, dict[str, Any]] = {}
    failures = 0
    try:
        done = 0
        while done < versions:
            ev = out.get(timeout=300)
            if ev["event"] == "training":
                console.print(f"  trainer training v{ev['version']} ({ev['steps']} steps)…")
                continue
            row = rows.setdefault(ev["version"], {})
            if ev["event"] == "published":
                row.update(ev)
                console.print(
                    f"  trainer published v{ev['version']} (loss {ev['loss']:.3f}, "
                    f"{ev['bytes'] / 2**20:.1f} MiB, root {ev['root'][:12]}…)"
                )
                inbox.put({k: ev[k] for k in ("version", "address", "root")})
            elif ev["event"] == "fetched":
                row["fetch"] = ev
                ok = ev["digests"] == row["digests"]
                failures += not ok
                console.print(
                    f"  rollout fetched v{ev['version']} in {ev['fetch_s'] * 1e3:.0f} ms, "
                    f"{'bit-identical' if ok else '[red]MISMATCH[/]'}; generated "
                    f"{ev['sample'][:6]} from prompt [5, 6, 7, 8]"
                )
                ctl.put(ev["version"])
            elif ev["event"] == "withdrawn":
                row["stall_s"] = ev["stall_s"]
                done += 1
    finally:
        inbox.put(None)
        trainer.join(30)
        rollout.join(30)
    table = Table(title="tensorhub demo: what happened")
    for col in ("ver", "loss", "MiB", "chunks", "fetch ms", "GB/s", "withdraw ms", "identical"):
        table.add_column(col, justify="right")
    for v, r in sorted(rows.items()):
        f = r["fetch"]
        table.add_row(
            str(v),
            f"{r['loss']:.2f}",
            f"{r['bytes'] / 2**20:.1f}",
            str(r["chunks"]),
            f"{f['fetch_s'] * 1e3:.0f}",
            f"{f['gbps']:.2f}",
            f"{r['stall_s'] * 1e3:.1f}",
            "yes" if f["digests"] == r["digests"] else "NO",
        )
    console.print(table)
    console.print(
        "Each version was served from the trainer's own memory (no store), fetched into "
        "preallocated rollout tensors, verified chunk by chunk (BLAKE3-128) and per tensor."
    )
    return 1 if failures or trainer.exitcode or rollout.exitcode else 0

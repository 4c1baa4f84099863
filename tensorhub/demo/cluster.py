"""``make demo``: a two-datacenter cluster on one machine, moving real weights by reference.

Seven processes: a trainer (dc1) and six rollouts (three per datacenter). The trainer and
one rollout per datacenter are the Raft voters. Each version the trainer trains TinyLM with
real gradient steps and publishes its rollout weights from its own memory; it may reuse
that memory as soon as one full copy exists elsewhere (its *stall*). Rollouts watch for new
versions, fetch them from whoever holds them — nearest first, serving each verified chunk
onward — check every tensor against the trainer's digests, and generate tokens with them.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
import tempfile
import time
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from ..hub import Hub
from ..io.loop import run
from ..io.tcp import free_ports
from ..io.tensors import empty_like_manifest, tensor_digests
from .model import TinyLM, load_rollout_weights, rollout_weights, synthetic_batch, train_step

MODEL = "policy"
CHUNK = 1 << 20  # 7 chunks per version of this small model, so rollouts can share
ROLLOUTS = [
    ("rollout-a1", "dc1/rack2/a1"),
    ("rollout-a2", "dc1/rack2/a2"),
    ("rollout-a3", "dc1/rack3/a3"),
    ("rollout-b1", "dc2/rack1/b1"),
    ("rollout-b2", "dc2/rack1/b2"),
    ("rollout-b3", "dc2/rack2/b3"),
]
VOTER_ROLLOUTS = {"rollout-a1", "rollout-b1"}


def _served(hub: Hub) -> int:
    return sum(h.bytes_served for h in hub.node.handlers)


def trainer_main(
    seeds: list[str], data: str, secret: str, versions: int, steps: int, out: Any
) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)

    async def main() -> None:
        hub = await Hub.start(
            "trainer",
            locality="dc1/rack1/trainer",
            listen=seeds[0],
            seeds=seeds,
            voter=True,
            data_dir=f"{data}/trainer",
            secret=secret,
        )
        out.put({"event": "up", "who": "trainer"})
        for v in range(1, versions + 1):
            # Compute runs off the event loop, so the Hub keeps serving, voting and gossiping
            # while the trainer trains (torch releases the GIL in its kernels).
            loss = await asyncio.to_thread(
                lambda: sum(
                    train_step(model, opt, synthetic_batch(model.cfg, g)) for _ in range(steps)
                )
            )
            weights = rollout_weights(model)
            t0 = time.perf_counter()
            pub = await hub.publish(MODEL, v, weights, chunk_size=CHUNK)
            t1 = time.perf_counter()
            # Stall until one full copy exists elsewhere; then the memory is the trainer's again.
            await hub.wait_replicated(MODEL, v, copies=1)
            await hub.unpublish(MODEL, v)
            t2 = time.perf_counter()
            out.put(
                {
                    "event": "published",
                    "version": v,
                    "loss": loss / steps,
                    "bytes": pub.manifest.total_bytes,
                    "chunks": pub.manifest.num_chunks,
                    "commit_s": t1 - t0,
                    "stall_s": t2 - t0,
                    "digests": tensor_digests(weights),
                }
            )
        out.put({"event": "served", "who": "trainer", "bytes": _served(hub)})
        await asyncio.sleep(3600)

    run(main())


def rollout_main(
    name: str, locality: str, seeds: list[str], data: str, secret: str, versions: int, out: Any
) -> None:
    torch.set_num_threads(1)
    model = TinyLM()
    prompt = torch.tensor([[5, 6, 7, 8]])

    async def main() -> None:
        voter = name in VOTER_ROLLOUTS
        listen = seeds[1 + sorted(VOTER_ROLLOUTS).index(name)] if voter else "127.0.0.1:0"
        hub = await Hub.start(
            name,
            locality=locality,
            listen=listen,
            seeds=seeds,
            voter=voter,
            data_dir=f"{data}/{name}" if voter else None,
            secret=secret,
        )
        out.put({"event": "up", "who": name})
        into: dict[str, torch.Tensor] | None = None
        async for v in hub.watch(MODEL, poll=0.05):
            if into is None:  # register once, transfer many: reused every version
                into = empty_like_manifest(await hub.manifest(MODEL, v))
            res = await hub.fetch(MODEL, v, into)
            load_rollout_weights(model, into)
            sample = (await asyncio.to_thread(model.generate, prompt, 6))[0, 4:].tolist()
            out.put(
                {
                    "event": "fetched",
                    "who": name,
                    "dc": locality.split("/", maxsplit=1)[0],
                    "version": v,
                    "fetch_s": res.seconds,
                    "digests": tensor_digests(into),
                    "sample": sample,
                }
            )
            if v >= versions:
                break
        await asyncio.sleep(1.0)  # others may still be fetching from us
        out.put({"event": "served", "who": name, "bytes": _served(hub)})
        await asyncio.sleep(3600)

    run(main())


def main(versions: int = 3, steps: int = 20) -> int:
    secret = os.environ.get("TENSORHUB_SECRET") or os.urandom(16).hex()
    seeds = [f"127.0.0.1:{p}" for p in free_ports(3)]
    data = tempfile.mkdtemp(prefix="tensorhub-demo-")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    console = Console()
    console.print(
        f"[bold]tensorhub demo[/]: 2 datacenters, a trainer and {len(ROLLOUTS)} "
        f"rollouts as {len(ROLLOUTS) + 1} processes; Raft voters: trainer, "
        f"{', '.join(sorted(VOTER_ROLLOUTS))}; {versions} versions of TinyLM"
    )
    procs = [
        ctx.Process(
            target=trainer_main,
            args=(seeds, data, secret, versions, steps, out),
            daemon=True,
            name="trainer",
        )
    ]
    procs += [
        ctx.Process(
            target=rollout_main,
            args=(n, loc, seeds, data, secret, versions, out),
            daemon=True,
            name=n,
        )
        for n, loc in ROLLOUTS
    ]
    for p in procs:
        p.start()
    pubs: dict[int, dict[str, Any]] = {}
    fetched: dict[int, list[dict[str, Any]]] = {}
    served: dict[str, int] = {}
    failures = 0
    t0 = time.perf_counter()
    try:
        deadline = time.monotonic() + 240
        while len(served) < len(procs):
            try:
                ev = out.get(timeout=1.0)
            except queue.Empty:
                dead = [p.name for p in procs if p.exitcode is not None]
                if dead or time.monotonic() > deadline:
                    why = f"exited: {', '.join(dead)}" if dead else "timed out"
                    console.print(f"[red]demo failed[/]: {why}")
                    return 1
                continue
            if ev["event"] == "published":
                pubs[ev["version"]] = ev
                console.print(
                    f"  trainer published v{ev['version']} (loss {ev['loss']:.2f}, "
                    f"{ev['bytes'] / 2**20:.1f} MiB); stalled "
                    f"{ev['stall_s'] * 1e3:.0f} ms until a full copy existed elsewhere"
                )
            elif ev["event"] == "fetched":
                fetched.setdefault(ev["version"], []).append(ev)
            elif ev["event"] == "served":
                served[ev["who"]] = ev["bytes"]
    finally:
        for p in procs:
            p.kill()
            p.join(10)
    for v, evs in sorted(fetched.items()):
        for ev in evs:
            if ev["digests"] != pubs[v]["digests"]:
                failures += 1
    table = Table(title=f"tensorhub demo: what happened ({time.perf_counter() - t0:.0f} s)")
    for col in (
        "ver",
        "loss",
        "MiB",
        "trainer stall ms",
        "fetch ms dc1",
        "fetch ms dc2",
        "rollouts",
        "bit-identical",
    ):
        table.add_column(col, justify="right")
    for v, pub in sorted(pubs.items()):
        evs = fetched.get(v, [])
        by_dc = {dc: [e["fetch_s"] * 1e3 for e in evs if e["dc"] == dc] for dc in ("dc1", "dc2")}
        ok = all(e["digests"] == pub["digests"] for e in evs)
        table.add_row(
            str(v),
            f"{pub['loss']:.2f}",
            f"{pub['bytes'] / 2**20:.1f}",
            f"{pub['stall_s'] * 1e3:.0f}",
            "/".join(f"{x:.0f}" for x in sorted(by_dc["dc1"])),
            "/".join(f"{x:.0f}" for x in sorted(by_dc["dc2"])),
            str(len(evs)),
            "yes" if ok else "NO",
        )
    console.print(table)
    model_bytes = sum(p["bytes"] for p in pubs.values())
    trainer = served.get("trainer", 0)
    console.print(
        f"The trainer served {trainer / model_bytes:.2f} model sizes per version "
        f"(a star, every rollout pulling from it, would serve {len(ROLLOUTS)}); rollouts "
        f"served {sum(b for w, b in served.items() if w != 'trainer') / model_bytes:.2f}. "
        "Every fetch was verified chunk by chunk against the committed manifest root."
    )
    return 1 if failures or len(fetched) < versions else 0

"""The verl-style checkpoint engine, driven as verl's CheckpointEngineManager drives one:
prepare, build_topology, init_process_group, send_weights on the trainer, receive_weights
on two rollout workers, finalize; two steps, bit for bit, one bucket at a time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from tensorhub.engines.checkpoint_engine import TensorHubCheckpointEngine
from tensorhub.io.loop import run

from .test_hub import SECRET, cluster, weights


def test_verl_style_weight_sync(tmp_path: Path) -> None:
    run(_two_steps(tmp_path))


async def _two_steps(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=0) as (voters, _):
        seeds = [v.address for v in voters]

        def engine(name: str, rack: str) -> TensorHubCheckpointEngine:
            return TensorHubCheckpointEngine(
                1 << 20, seeds=seeds, secret=SECRET, locality=f"dc0/{rack}", name=name
            )

        trainer = engine("trainer", "rack1")
        rollouts = [engine(f"rollout{i}", "rack2") for i in range(2)]
        try:
            every = [trainer, *rollouts]
            meta = await asyncio.gather(*(asyncio.to_thread(e.prepare) for e in every))
            tk, rk = TensorHubCheckpointEngine.build_topology(1, 2, meta)
            trainer.init_process_group(rank=tk["rank"][0])
            for e, r in zip(rollouts, rk["rank"], strict=True):
                e.init_process_group(rank=r)
            for step in (1, 2):
                sd = weights(step, mib=4)
                await trainer.send_weights(iter(sd.items()))
                for e in rollouts:
                    got = {n: t.clone() async for n, t in e.receive_weights()}
                    assert set(got) == set(sd)
                    assert all(torch.equal(got[n], sd[n]) for n in sd)
                    assert e.version == step
                for e in every:
                    e.finalize()
        finally:
            for e in (trainer, *rollouts):
                await asyncio.to_thread(e.close)

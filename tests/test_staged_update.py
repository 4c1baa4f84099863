"""Atomic apply across processes: kill -9 the only holder mid-update, and the engine's
live weights are still the old version, bit for bit; the error says why."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from tensorhub import Hub, TensorHubError
from tensorhub.engines import StagedWeights
from tensorhub.io.loop import run
from tensorhub.io.tensors import empty_like_manifest, tensor_digests
from tensorhub.testing.hub_procs import SECRET, HubProcs, Spec
from tensorhub.testing.weights import llm_like_state_dict

SIZE = 96 << 20
CHUNK = 1 << 20
MODEL = "policy"


def specs() -> list[Spec]:
    return [Spec(f"voter{i}", f"dc0/rack0/v{i}", voter=True) for i in range(3)] + [
        Spec("trainer", "dc0/rack1/trainer")
    ]


@pytest.mark.timeout(300)
def test_a_killed_update_leaves_the_old_version_live(tmp_path: Path) -> None:
    """Once, on the default loop (it is a multi-process test: the loop is not what it tests)."""
    run(_killed_update(tmp_path))


async def _killed_update(tmp_path: Path) -> None:
    with HubProcs(specs(), str(tmp_path)) as c:
        seeds = [c.addr[f"voter{i}"] for i in range(3)]
        engine = await Hub.start("engine", locality="dc0/rack2/e", seeds=seeds, secret=SECRET)
        try:
            c.call(["trainer"], "publish", MODEL, 1, SIZE, 1, CHUNK)
            live = empty_like_manifest(await engine.manifest(MODEL, 1))
            staged = StagedWeights(live)
            await staged.update(engine, MODEL, 1)
            v1 = tensor_digests(llm_like_state_dict(SIZE, seed=1))
            assert tensor_digests(live) == v1 and staged.version == 1

            c.call(["trainer"], "publish", MODEL, 2, SIZE, 2, CHUNK)
            update = asyncio.ensure_future(staged.update(engine, MODEL, 2, timeout=60))
            held = 0
            while held == 0 and not update.done():  # the first chunk of v2 verified here
                await asyncio.sleep(0.001)
                held = max((r.held for r in engine.node.store if r.version == 2), default=0)
            os.kill(c.procs["trainer"].pid, signal.SIGKILL)  # the only holder of v2
            print(f"killed the trainer with {held} of {SIZE // CHUNK} chunks of v2 here")
            with pytest.raises(TensorHubError) as err:
                await update
            print(f"the update failed with: {err.value!r}")
            assert held < SIZE // CHUNK, "the update finished before the kill: no test"
            assert "v2" in str(err.value) and "holder" in str(err.value)
            assert tensor_digests(live) == v1, "a failed update changed the live weights"
            assert staged.version == 1
        finally:
            await engine.close()

"""Device (CUDA) tensors: pinned snapshots on publish, a pinned mirror copied to the device
chunk by chunk on fetch. The CUDA tests skip where no GPU exists; the arena's layout is
tested everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tensorhub.core.digest import digest_parts
from tensorhub.dataplane.swarm import Holder, swarm_fetch
from tensorhub.io.device import _POOL, POOL_SIZE, PinnedArena
from tensorhub.io.tensors import TensorBytes, build_manifest, empty_like_manifest

from .models import awkward, every_dtype, same_bytes
from .test_hub import cluster
from .test_hub import weights as hub_weights
from .test_swarm import model, nodes

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _to(sd: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    """``sd`` on ``device``, keeping ties (the same view stays the same tensor)."""
    out: dict[int, torch.Tensor] = {}
    return {k: out.setdefault(id(t), t.to(device)) for k, t in sd.items()}


def test_arena_twins_are_aligned_for_every_dtype() -> None:
    like = [torch.empty(3, dtype=torch.uint8), torch.empty(5, dtype=torch.float64)]
    like += [torch.empty((7, 3), dtype=torch.bfloat16), torch.empty((), dtype=torch.int32)]
    arena, twins = PinnedArena.carve(like)
    got = list(twins)
    assert [(t.dtype, t.shape) for t in got] == [(t.dtype, t.shape) for t in like]
    base = arena.memory.data_ptr()
    assert all((t.data_ptr() - base) % 64 == 0 for t in got)
    for i, t in enumerate(got):  # disjoint: writing one leaves the others alone
        t.reshape(-1).view(torch.uint8).fill_(i + 1)
    assert all(bool((t.reshape(-1).view(torch.uint8) == i + 1).all()) for i, t in enumerate(got))


@cuda
def test_arena_is_page_locked_and_reused_once_freed() -> None:
    arena = PinnedArena(3 << 20)
    assert arena.registered and arena.memory.is_pinned()
    ptr = arena.memory.data_ptr()
    del arena
    again = PinnedArena(3 << 20)  # the next version, the same size: no pinning again
    assert again.memory.data_ptr() == ptr and again.memory.is_pinned()
    view = memoryview(again.memory[:16].numpy())  # a send still reading it, say
    del again
    assert PinnedArena(3 << 20).memory.data_ptr() != ptr  # not reused under the reader
    del view
    others = [PinnedArena(1 << 20) for _ in range(POOL_SIZE + 2)]
    del others  # the pool keeps POOL_SIZE, unregisters the rest
    assert len(_POOL) == POOL_SIZE


@cuda
@pytest.mark.parametrize("make", [every_dtype, awkward], ids=["every_dtype", "awkward"])
def test_publish_from_cuda_matches_cpu_and_survives_later_writes(make: object) -> None:
    sd = make()  # type: ignore[operator]
    want = build_manifest(TensorBytes.from_state_dict(sd, chunk_size=8192))
    dev = _to(sd, "cuda")
    src = TensorBytes.from_state_dict(dev, chunk_size=8192)
    assert build_manifest(src).root == want.root  # same bytes, same layout, ties kept
    for t in dev.values():
        if t.numel() and t.is_contiguous():
            t.reshape(-1).view(torch.uint8).bitwise_not_()  # the trainer's next step
    assert all(digest_parts(src.read_parts(i)) == want.digests[i] for i in range(want.num_chunks))


@cuda
@pytest.mark.parametrize("make", [every_dtype, awkward], ids=["every_dtype", "awkward"])
def test_fetch_into_cuda_is_bit_identical(make: object) -> None:
    sd = make()  # type: ignore[operator]
    src = TensorBytes.from_state_dict(sd, chunk_size=4096)
    m = build_manifest(src)
    into = {k: torch.empty_like(v, device="cuda") for k, v in sd.items()}  # untied
    if "transposed" in sd:
        into["transposed"] = torch.zeros(300, 200, device="cuda").t()  # staged, then copied
    dst = TensorBytes.for_destination(m, into)
    for i in range(m.num_chunks):
        for s, d in zip(src.read_parts(i), dst.write_parts(i), strict=True):
            d[:] = s
        dst.landed(i)
    dst.finalize()
    for k, t in sd.items():
        assert into[k].is_cuda and same_bytes(t, into[k].cpu()), k


@cuda
def test_each_chunk_reaches_the_device_before_finalize() -> None:
    """The pipelining itself: a landed chunk is on the device once its copy stream is
    drained, while later chunks are still missing there."""
    sd = {"w": torch.arange(1 << 20, dtype=torch.float32)}
    src = TensorBytes.from_state_dict(sd, chunk_size=1 << 18)
    m = build_manifest(src)
    into = empty_like_manifest(m, "cuda")
    into["w"].fill_(-1)
    dst = TensorBytes.for_destination(m, into)
    half = m.num_chunks // 2
    for i in range(half):
        for s, d in zip(src.read_parts(i), dst.write_parts(i), strict=True):
            d[:] = s
        dst.landed(i)
    torch.cuda.synchronize()
    w = into["w"].cpu()
    cut = sum(m.layout.chunk_len(i) for i in range(half)) // 4
    assert torch.equal(w[:cut], sd["w"][:cut])
    assert bool((w[cut:] == -1).all())


@cuda
async def test_swarm_fetch_gpu_to_gpu_over_the_network(transport: str) -> None:
    sd = _to(model(16), "cuda")
    async with nodes(3, transport) as (a, b, me):
        m = a.serve("m", 1, sd, chunk_size=1 << 20)
        mid = empty_like_manifest(m, "cuda")
        await swarm_fetch(b, "m", 1, mid, [Holder(a.address, 1)], expected_root=m.root, seed=1)
        await a.withdraw("m", 1)
        into = empty_like_manifest(m, "cuda")  # served by b, a fetcher, from its mirror
        await swarm_fetch(me, "m", 1, into, [Holder(b.address, 1)], expected_root=m.root, seed=2)
        assert all(into[k].is_cuda and same_bytes(sd[k].cpu(), into[k].cpu()) for k in sd)


@cuda
async def test_hub_publishes_and_fetches_cuda_weights(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=2) as (voters, rolls):
        w = _to(hub_weights(1), "cuda")
        pub = await voters[0].publish("policy", 1, w, chunk_size=1 << 20)
        for t in w.values():
            t.add_(1)  # the trainer moves on; version 1 is unchanged
        for r in rolls:
            into = empty_like_manifest(pub.manifest, "cuda")
            await r.fetch("policy", 1, into)
            assert all(same_bytes(hub_weights(1)[k], into[k].cpu()) for k in into)

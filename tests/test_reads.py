"""Partial reads: bounded-memory streams and tensor-parallel slices, on a real cluster."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from tensorhub.core.buckets import bucket_capacity, chunks_for, plan_buckets
from tensorhub.core.layout import TensorDesc, plan_layout
from tensorhub.io.chunk_buffer import ChunkBuffer
from tensorhub.reads import TensorSlice, tensor_parallel

from .test_hub import cluster

CHUNK = 1 << 16


def model(version: int) -> dict[str, torch.Tensor]:
    """Tensors of every kind a stream must cut right: big, tiny, tied, empty, scalar."""
    g = torch.Generator().manual_seed(version)
    embed = torch.randn(512, 256, generator=g).to(torch.bfloat16)  # 256 KiB: 4 chunks
    return {
        "embed": embed,
        "norm": torch.randn(100, generator=g),
        "empty": torch.empty(0, 3),
        "qkv": torch.randn(384, 128, generator=g).half(),  # dim 0: 3 heads x 128
        "o_proj": torch.randn(128, 256, generator=g).half(),  # sharded on dim 1
        "step": torch.tensor(version),
        "lm_head": embed,  # tied: sent once
    }


def test_buckets_hold_whole_tensors_within_the_bound() -> None:
    sd = model(1)
    layout = plan_layout(
        [TensorDesc(k, str(v.dtype).removeprefix("torch."), tuple(v.shape)) for k, v in sd.items()],
        CHUNK,
    )
    for bound in (CHUNK, 2 * CHUNK, 5 * CHUNK, 1 << 30):
        buckets = plan_buckets(layout, bound)
        seen = [i for b in buckets for i in b.tensors]
        assert sorted(seen) == list(range(len(layout.tensors)))  # each tensor exactly once
        biggest = max(len(layout.chunks_of(i)) for i in range(len(layout.tensors)))
        assert bucket_capacity(buckets, CHUNK) <= max(bound, biggest * CHUNK)
        for b in buckets:
            for i in b.tensors:
                assert set(layout.chunks_of(i)) <= set(b.chunks)
        for a, b in itertools.pairwise(buckets):
            assert b.first >= a.end - 1  # at most one shared boundary chunk


def test_chunk_buffer_views_and_gathers() -> None:
    layout = plan_layout([TensorDesc("a", "float32", (70_000,))], CHUNK)  # 5 chunks
    flat = torch.arange(70_000, dtype=torch.float32)
    raw = flat.view(torch.uint8)
    buf = ChunkBuffer(layout, [3, 1, 2])  # out of order: gathers copy across slots
    for c in (3, 1, 2):
        s, e = layout.chunk_range(c)
        buf.write_parts(c)[0][:] = memoryview(raw[s:e].numpy())
    lo, hi = CHUNK + 100 * 4, 4 * CHUNK - 8
    got = buf.gather(lo, hi).view(torch.float32)
    assert torch.equal(got, flat[lo // 4 : hi // 4])
    assert chunks_for({"a": (lo, hi)}, CHUNK) == [1, 2, 3]


async def test_stream_yields_every_tensor_bit_exact_in_bounded_buckets(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=2) as (voters, rolls):
        sd = model(7)
        pub = await voters[0].publish("m", 7, sd, chunk_size=CHUNK)
        got: dict[str, torch.Tensor] = {}
        buckets = 0
        async for bucket in rolls[0].stream("m", 7, bucket_bytes=2 * CHUNK):
            buckets += 1
            for name, t in bucket:
                got[name] = t.clone()  # the buffer is reused by the next bucket
        assert buckets >= 3
        assert set(got) == set(sd)
        for k, v in sd.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
        # Not a holder: a partial read serves nothing onward.
        assert not any(r.version == 7 for r in rolls[0].node.store)
        # Every chunk moved once: a boundary chunk is carried into the next bucket.
        assert rolls[0].fetch_totals["partial_bytes"] == pub.manifest.total_bytes


async def test_stream_from_a_version_held_here_copies_locally(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=1) as (voters, _):
        sd = model(3)
        await voters[0].publish("m", 3, sd, chunk_size=CHUNK)
        names = [n async for b in voters[0].stream("m", 3, bucket_bytes=CHUNK) for n, _ in b]
        assert sorted(names) == sorted(sd)


async def test_tensor_parallel_ranks_fetch_their_share(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=2) as (voters, rolls):
        sd = model(5)
        pub = await voters[0].publish("m", 5, sd, chunk_size=CHUNK)
        dims = {"embed": 0, "qkv": 0, "o_proj": 1}
        parts = []
        for rank, hub in enumerate(rolls):
            slices = tensor_parallel(pub.manifest, rank, 2, dims)
            into = {
                n: torch.empty(
                    s.stop - s.start if s.dim == 0 else sd[n].shape[0],
                    *(sd[n].shape[1:] if s.dim == 0 else (s.stop - s.start,)),
                    dtype=sd[n].dtype,
                )
                for n, s in slices.items()
            }
            into["norm"] = torch.empty(100)
            res = await hub.fetch_slices("m", 5, into, slices)
            parts.append((into, res.bytes))
        (a, bytes_a), (b, bytes_b) = parts
        assert torch.equal(torch.cat([a["embed"], b["embed"]]), sd["embed"])
        assert torch.equal(torch.cat([a["qkv"], b["qkv"]]), sd["qkv"])
        assert torch.equal(torch.cat([a["o_proj"], b["o_proj"]], dim=1), sd["o_proj"])
        assert torch.equal(a["norm"], sd["norm"]) and torch.equal(b["norm"], sd["norm"])
        # Each rank moved its rows of embed/qkv (whole chunks), o_proj and norm whole.
        whole = pub.manifest.total_bytes
        assert bytes_a < whole and bytes_b < whole


async def test_a_slice_of_the_wrong_shape_is_refused_before_a_byte_moves(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=1) as (voters, rolls):
        pub = await voters[0].publish("m", 1, model(1), chunk_size=CHUNK)
        from tensorhub.core.errors import ManifestError

        with pytest.raises(ManifestError, match="the read gives"):
            await rolls[0].fetch_slices(
                "m", 1, {"qkv": torch.empty(384, 128).half()}, {"qkv": TensorSlice(0, 0, 192)}
            )
        assert rolls[0].fetch_totals["partial_bytes"] == 0
        assert pub.committed


async def test_an_origin_neither_holds_back_nor_points_others_to_a_partial_reader(
    tmp_path: Path,
) -> None:
    """A partial reader serves nothing onward: the publisher must not count it among a
    chunk's recipients (others would be sent to a node that cannot answer), nor hold a
    remote one back for our datacenter to carry the chunk across the WAN first (each of
    its chunks waited ``reserve_after``: 40 redirects, 1.0 s for 128 KiB)."""
    async with cluster(tmp_path, rollouts=2) as (voters, rolls):
        sd = model(9)
        pub = await voters[0].publish("m", 9, sd, chunk_size=CHUNK)
        remote = rolls[1]  # dc1; the publisher is in dc0
        slices = tensor_parallel(pub.manifest, 1, 2, {"embed": 0})
        into = {"embed": torch.empty(256, 256, dtype=torch.bfloat16)}
        res = await remote.fetch_slices("m", 9, into, slices)
        assert res.failures == {}
        async for _ in rolls[0].stream("m", 9, bucket_bytes=2 * CHUNK):
            pass
        seeder = next(r.seeder for r in voters[0].node.store if r.version == 9)
        assert seeder is not None
        got = {p for peers in seeder.recipients.values() for p in peers}
        assert not got & {remote.address, rolls[0].address}


async def test_a_stream_gives_a_rank_major_tensor_back_in_its_logical_layout(
    tmp_path: Path,
) -> None:
    from tensorhub.transforms import ShardMajor

    async with cluster(tmp_path, rollouts=1) as (voters, rolls):
        sd = model(4)
        pub = await voters[0].publish(
            "m", 4, sd, chunk_size=CHUNK, transforms=[ShardMajor("o_proj", dim=1, world=4)]
        )
        spec = next(t for t in pub.manifest.tensors if t.name == "o_proj")
        assert spec.shape == (4, 128, 64)  # published rank-major
        got = {n: t.clone() async for b in rolls[0].stream("m", 4) for n, t in b}
        assert torch.equal(got["o_proj"], sd["o_proj"])  # read back as the trainer had it

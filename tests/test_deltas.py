"""Delta versions (issue #21): a version published with ``delta_from=u`` also commits a delta
object; a fetcher holding u moves the delta instead of the model, rebuilds every chunk,
verifies each against v's committed digests and takes whole what does not match."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard

from tensorhub.core.delta import (
    DeltaError,
    decode_chunk,
    delta_model,
    encode_chunk,
    pack,
    unpack,
)
from tensorhub.core.errors import UnknownVersion
from tensorhub.core.naming import shard_key
from tensorhub.dataplane.fetch import FetchResult
from tensorhub.hub import Hub, NoHolder, Published
from tensorhub.io.tensors import empty_like_manifest, tensor_digests
from tensorhub.testing.hub_procs import HubProcs, Spec
from tensorhub.testing.weights import nudged

from .test_hub import cluster, weights

CHUNK = 1 << 20


# -- the codec ------------------------------------------------------------------------------


def test_codec_round_trip_and_incompressible_chunks_travel_whole() -> None:
    z, d = zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()
    base = np.frombuffer(os.urandom(1 << 16), np.uint8)
    new = base.copy()
    new[::97] ^= 1
    enc = encode_chunk(base, new, z)
    assert enc is not None and len(enc) < len(new) // 10
    assert np.array_equal(decode_chunk(base, enc, d), new)
    other = np.frombuffer(os.urandom(1 << 16), np.uint8)
    assert encode_chunk(base, other, z) is None  # a delta no smaller than the chunk
    header, blob = pack(4, [enc, None, enc])
    index = unpack(header, len(blob), 3)
    assert index.base == 4 and index.chunks == 2 and not index.encoded(1)


def test_codec_refuses_malformed_deltas_with_a_clear_error() -> None:
    z, d = zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()
    base = np.zeros(4096, np.uint8)
    header, blob = pack(1, [encode_chunk(base, base, z)])
    with pytest.raises(DeltaError, match="for 2"):
        unpack(header, len(blob), 2)
    bad = header.copy()
    bad[4] = len(blob) + 1  # a span past the blob
    with pytest.raises(DeltaError, match="outside the blob"):
        unpack(bad, len(blob), 1)
    bad = header.copy()
    bad[0] = 9
    with pytest.raises(DeltaError, match="format 9"):
        unpack(bad, len(blob), 1)
    with pytest.raises(DeltaError, match="does not decode"):
        decode_chunk(base, b"not zstd", d)
    big = z.compress(bytes(8192))  # decodes to more than a chunk: refused, not allocated
    with pytest.raises(DeltaError):
        decode_chunk(base, big, d)


# -- on a cluster ---------------------------------------------------------------------------


@dataclass
class OnV1:
    """A publisher in dc0 and a rollout in dc1 that holds v1 in ``into``."""

    pub: Hub
    far: Hub
    w1: dict[str, torch.Tensor]
    p1: Published
    into: dict[str, torch.Tensor]
    first: FetchResult


async def on_v1(voters: list[Hub], rolls: list[Hub], mib: int = 4) -> OnV1:
    pub, far = voters[0], rolls[1]  # rolls[1] is in dc1
    w1 = weights(1, mib=mib)
    p1 = await pub.publish("policy", 1, w1, chunk_size=CHUNK)
    into = empty_like_manifest(p1.manifest)
    return OnV1(pub, far, w1, p1, into, await far.fetch("policy", 1, into))


async def test_a_delta_moves_a_fraction_and_rebuilds_bit_for_bit(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=2) as (voters, rolls):
        v1 = await on_v1(voters, rolls)
        pub, far, w1, p1, into, first = v1.pub, v1.far, v1.w1, v1.p1, v1.into, v1.first
        assert first.delta_base is None and first.bytes == p1.manifest.total_bytes
        w2 = nudged(w1, 2)
        p2 = await pub.publish("policy", 2, w2, chunk_size=CHUNK, delta_from=1)
        assert p2.committed
        res = await far.fetch("policy", 2, into)
        total = p2.manifest.total_bytes
        print(f"delta {res.delta_bytes} B of {total} ({res.delta_bytes / total:.3%})")
        assert res.delta_base == 1
        assert res.delta_chunks == p2.manifest.num_chunks and res.delta_refused == 0
        assert res.bytes == 0 and 0 < res.delta_bytes < 0.1 * total
        assert tensor_digests(into) == tensor_digests(w2)
        # Into the base's memory: the fetch was an unpublish of v1 here.
        with pytest.raises(UnknownVersion):
            far.node.store.get(shard_key("policy", 0), 1)
        assert far.node.store.get(shard_key("policy", 0), 2).complete
        # The fetcher serves the delta onward, as any version.
        assert far.node.store.get(shard_key(delta_model("policy"), 0), 2).complete


async def test_a_corrupt_base_is_caught_by_digest_and_refetched_whole(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=2) as (voters, rolls):
        v1 = await on_v1(voters, rolls)
        pub, far, w1, into = v1.pub, v1.far, v1.w1, v1.into
        into["embed"].view(-1)[:1000] = 0  # this node's v1 differs from the committed v1
        w2 = nudged(w1, 2)
        await pub.publish("policy", 2, w2, chunk_size=CHUNK, delta_from=1)
        res = await far.fetch("policy", 2, into)
        assert res.delta_base == 1 and res.delta_refused == 1  # the first chunk
        assert res.bytes == CHUNK  # fetched whole
        assert tensor_digests(into) == tensor_digests(w2)


async def test_a_delta_from_a_version_not_held_here_goes_whole(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=2) as (voters, rolls):
        v1 = await on_v1(voters, rolls)
        pub, far, w1, p1, into = v1.pub, v1.far, v1.w1, v1.p1, v1.into
        w2 = nudged(w1, 2)
        await pub.publish("policy", 2, w2, chunk_size=CHUNK, delta_from=1)
        w3 = nudged(w2, 3)
        await pub.publish("policy", 3, w3, chunk_size=CHUNK, delta_from=2)
        res = await far.fetch("policy", 3, into)  # its v1 is not v3's base
        assert res.delta_base is None and res.bytes == p1.manifest.total_bytes
        assert tensor_digests(into) == tensor_digests(w3)


async def test_publishing_a_delta_needs_its_base_held(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=1) as (voters, _rolls):
        pub = voters[0]
        await pub.publish("policy", 1, weights(1, mib=1), chunk_size=CHUNK)
        with pytest.raises(UnknownVersion, match="needs that version held here"):
            await pub.publish("policy", 2, weights(2, mib=1), chunk_size=CHUNK, delta_from=7)
        assert await pub.latest("policy") == 1  # nothing committed


@pytest.mark.timeout(300)
def test_in_processes_a_stale_base_is_refetched_whole_and_a_good_one_is_not(
    tmp_path: Path,
) -> None:
    """Five Hub processes: two rollouts in dc1 hold v1; one's v1 turns corrupt. Both then
    fetch v2 (a small step, published with a delta from v1) into the same memory: the
    good one moves only the delta, the corrupt one's chunks fail their digests and come
    whole, and both end on the trainer's bytes."""
    specs = [
        Spec("trainer", "dc0/rack0/trainer", voter=True),
        Spec("voter-a", "dc0/rack1/voter-a", voter=True),
        Spec("voter-b", "dc1/rack0/voter-b", voter=True),
        Spec("good", "dc1/rack1/good"),
        Spec("stale", "dc1/rack1/stale"),
    ]
    size, both = 16 << 20, ["good", "stale"]
    with HubProcs(specs, str(tmp_path)) as c:
        c.call(["trainer"], "publish", "policy", 1, size, 1)
        c.call(both, "prepare", "policy", 1, None)
        c.call(both, "fetch", "policy", 1, None)
        c.call(both, "result", "policy", 1, tag="done")
        c.call(["stale"], "corrupt", "policy", 1)  # its v1 no longer the committed v1
        c.call(["trainer"], "step", "policy", 1, 2, 0.02, 2)
        c.call(both, "reuse", "policy", 1, 2)
        c.call(both, "fetch", "policy", 2, None)
        done = dict(zip(both, c.call(both, "result", "policy", 2, tag="done"), strict=True))
        (want,) = c.call(["trainer"], "digests", "policy", 2)[0]
        for n, (got,) in zip(both, c.call(both, "digests", "policy", 2), strict=True):
            assert got == want, f"{n} is not on the trainer's v2"
    good, stale = done["good"][4], done["stale"][4]
    print(f"good: {good}; stale: {stale}")
    assert good["base"] == 1 and good["refused"] == 0 and good["whole_bytes"] == 0
    assert 0 < good["bytes"] < 0.1 * size
    assert stale["base"] == 1 and stale["refused"] > 0
    assert stale["whole_bytes"] >= stale["refused"] * (1 << 20)


async def test_a_delta_nobody_holds_any_more_costs_its_patience_not_the_deadline(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, rollouts=2) as (voters, rolls):
        v1 = await on_v1(voters, rolls, mib=2)
        pub, far, w1, p1, into = v1.pub, v1.far, v1.w1, v1.p1, v1.into
        w2 = nudged(w1, 2)
        await pub.publish("policy", 2, w2, chunk_size=CHUNK, delta_from=1)
        await pub._withdraw(shard_key(delta_model("policy"), 0), 2)  # its only holder
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        res = await far.fetch("policy", 2, into, timeout=8.0)  # patience: 4 s
        took = loop.time() - t0
        print(f"delta gone: whole after {took:.1f}s")
        assert res.delta_base is None and res.bytes == p1.manifest.total_bytes
        assert tensor_digests(into) == tensor_digests(w2)
        assert took < 8.0


async def test_a_version_every_holder_moved_on_from_fails_within_patience(
    tmp_path: Path,
) -> None:
    """Regression (session 8): a rollout a version behind asked for a v2 that every holder
    had overwritten with v3; it fetched v2's delta, then waited its whole timeout (240 s in
    a launch) for v2's manifest. Now: NoHolder within the delta patience."""
    async with cluster(tmp_path, rollouts=2) as (voters, rolls):
        v1 = await on_v1(voters, rolls, mib=2)
        w2 = nudged(v1.w1, 2)
        await v1.pub.publish("policy", 2, w2, chunk_size=CHUNK, delta_from=1)
        await v1.pub._withdraw(shard_key("policy", 0), 2)  # v2's only holder lets it go
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(NoHolder, match="policy v2"):
            await v1.far.fetch("policy", 2, v1.into, timeout=8.0)  # patience: 4 s
        took = loop.time() - t0
        print(f"gone: NoHolder after {took:.1f}s")
        assert took < 8.0
        assert tensor_digests(v1.into) == tensor_digests(v1.w1)  # v1 untouched

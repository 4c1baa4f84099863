"""bench/deltas.py's encodings: every one gives the new chunk back bit for bit, and a delta
with few changed words encodes to about their share of the bytes."""

from __future__ import annotations

import numpy as np
import pytest

from bench.deltas import CHUNK, ENCODINGS, measure_pair


def test_a_sparse_change_encodes_small_and_decodes_exactly(seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 2**16, size=(CHUNK + CHUNK // 2) // 2, dtype=np.uint16)
    new = base.copy()
    changed = rng.choice(len(new), size=len(new) // 100, replace=False)  # 1 % of the words
    new[changed] ^= rng.integers(1, 2**16, size=len(changed), dtype=np.uint16)
    r = measure_pair(base.view(np.uint8), new.view(np.uint8))  # raises if a decode is wrong
    assert r.changed == pytest.approx(0.01, rel=0.01)
    assert r.full_zstd > 0.95  # random bytes: nothing to gain without the base
    assert r.sizes["sparse"] < 0.05  # 4-byte gap + 2-byte value per changed word, zstd'd
    assert r.best == min(r.sizes.values())
    assert sum(r.choice.values()) == 2 and set(r.choice) == {*ENCODINGS, "raw"}


def test_an_unchanged_version_costs_almost_nothing() -> None:
    base = np.arange(CHUNK, dtype=np.uint8)
    r = measure_pair(base, base.copy())
    assert r.changed == 0 and r.best < 0.001

"""Durable Raft storage: round trips, torn tails, corruption, a full disk."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tensorhub.core.raft import Entry, HardState, Snapshot
from tensorhub.io import raft_storage
from tensorhub.io.raft_storage import CorruptStorage, RaftStorage, StorageError


def ents(lo: int, hi: int, term: int = 1) -> list[Entry]:
    return [Entry(term, i, f"e{i}".encode()) for i in range(lo, hi + 1)]


def test_roundtrip_with_truncate_and_snapshot(tmp_path: Path) -> None:
    s = RaftStorage.open(tmp_path)
    s.save(HardState(1, "a", 0), ents(1, 5))
    s.save(HardState(2, "b", 3), [Entry(2, 4, b"x"), Entry(2, 5, b"y")])  # truncates 4, 5
    s.save_snapshot(Snapshot(3, 1, b"state", ("a", "b", "c")))
    s.save(None, [Entry(2, 6, b"z")])
    s.close()
    r = RaftStorage.open(tmp_path).recovered
    assert r.hard_state == HardState(2, "b", 3)
    assert r.snapshot == Snapshot(3, 1, b"state", ("a", "b", "c"))
    assert [(e.index, e.term, e.data) for e in r.entries] == [
        (4, 2, b"x"),
        (5, 2, b"y"),
        (6, 2, b"z"),
    ]
    assert r.truncated_bytes == 0


@pytest.mark.parametrize("cut", [1, 5, 17, 20])
def test_torn_tail_is_truncated_and_earlier_state_kept(tmp_path: Path, cut: int) -> None:
    s = RaftStorage.open(tmp_path)
    s.save(HardState(1, "a", 2), ents(1, 3))
    good = (tmp_path / "raft.wal").stat().st_size
    s.save(HardState(2, "a", 3), ents(4, 4, term=2))
    s.close()
    wal = tmp_path / "raft.wal"
    data = wal.read_bytes()
    wal.write_bytes(data[: len(data) - cut])  # the crash cut the last write short
    st = RaftStorage.open(tmp_path)
    r = st.recovered
    assert r.truncated_bytes > 0
    assert wal.stat().st_size <= len(data) - cut
    assert r.entries[:3] == ents(1, 3)
    assert wal.stat().st_size >= good
    st.save(HardState(3, None, 3), ents(5, 5, term=3))  # appending after truncation works
    st.close()
    assert RaftStorage.open(tmp_path).recovered.hard_state == HardState(3, None, 3)


def test_zero_filled_tail_is_torn(tmp_path: Path) -> None:
    s = RaftStorage.open(tmp_path)
    s.save(HardState(1, "a", 0), ents(1, 2))
    s.close()
    with open(tmp_path / "raft.wal", "ab") as f:
        f.write(b"\0" * 4096)
    r = RaftStorage.open(tmp_path).recovered
    assert r.truncated_bytes == 4096 and len(r.entries) == 2


def test_bit_flip_in_the_middle_is_refused(tmp_path: Path) -> None:
    s = RaftStorage.open(tmp_path)
    s.save(HardState(1, "a", 0), ents(1, 3))
    s.save(HardState(2, "a", 0), ents(4, 6))
    s.close()
    wal = tmp_path / "raft.wal"
    data = bytearray(wal.read_bytes())
    data[30] ^= 0x01  # inside the first record's payload
    wal.write_bytes(bytes(data))
    with pytest.raises(CorruptStorage, match="checksum"):
        RaftStorage.open(tmp_path)


def test_corrupt_snapshot_is_refused(tmp_path: Path) -> None:
    s = RaftStorage.open(tmp_path)
    s.save_snapshot(Snapshot(1, 1, b"state", ("a",)))
    s.close()
    snap = tmp_path / "raft.snap"
    data = bytearray(snap.read_bytes())
    data[-1] ^= 0xFF
    snap.write_bytes(bytes(data))
    with pytest.raises(CorruptStorage, match="snapshot"):
        RaftStorage.open(tmp_path)


def test_full_disk_raises_and_loses_nothing_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = RaftStorage.open(tmp_path)
    s.save(HardState(1, "a", 1), ents(1, 2))
    real_write = os.write
    calls = {"n": 0}

    def full(fd: int, data: object) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, memoryview(data)[:7])  # type: ignore[arg-type]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(raft_storage.os, "write", full)
    with pytest.raises(StorageError, match="No space left"):
        s.save(HardState(2, "a", 2), ents(3, 3, term=2))
    monkeypatch.undo()
    s.close()
    r = RaftStorage.open(tmp_path).recovered  # the half-written record is a torn tail
    assert r.hard_state == HardState(1, "a", 1) and r.entries == ents(1, 2)
    assert r.truncated_bytes == 7


def test_rewrite_drops_compacted_entries(tmp_path: Path) -> None:
    s = RaftStorage.open(tmp_path)
    s.save(HardState(1, "a", 10), ents(1, 10))
    s.save_snapshot(Snapshot(8, 1, b"st", ("a",)))
    s.rewrite(HardState(1, "a", 10), ents(1, 10))
    s.save(None, ents(11, 11))
    s.close()
    r = RaftStorage.open(tmp_path).recovered
    assert [e.index for e in r.entries] == [9, 10, 11] and r.snapshot is not None


def test_crash_between_snapshot_and_marker(tmp_path: Path) -> None:
    s = RaftStorage.open(tmp_path)
    s.save(HardState(1, "a", 5), ents(1, 5))
    s.close()
    # A snapshot file landed, but the compaction marker never reached the WAL.
    RaftStorage.open(tmp_path).close()
    blob_store = RaftStorage.open(tmp_path)
    blob_store._write = lambda data: None  # type: ignore[method-assign]
    blob_store.save_snapshot(Snapshot(3, 1, b"st", ("a",)))
    blob_store.close()
    r = RaftStorage.open(tmp_path).recovered
    assert [e.index for e in r.entries] == [4, 5]

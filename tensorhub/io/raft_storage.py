"""Durable Raft state: a checksummed write-ahead log plus an atomically replaced snapshot.

Files in ``data_dir``::

    raft.wal    records: magic "RW" | type u8 | length u32 | xxh3-64 u64 | msgpack payload
    raft.snap   magic "RS" | length u64 | xxh3-64 u64 | msgpack Snapshot

Record types: a Ready's state (optional hard state plus entries, the latter meaning
"truncate from the first entry's index, then append", exactly what a Ready asks for) — one
record per :meth:`RaftStorage.save`, so a save is all or nothing — and a compaction marker
(entries up to an index now live in the snapshot). Every save ends with one ``fsync``.

Recovery reads records in order. A record cut short by a crash — an incomplete header or
payload, or a bad checksum on the *last* record, or zero fill after the last good record —
is a torn tail: it is truncated, because its write was never acknowledged. Anything else
that does not check out (a bad record followed by more data, a bad snapshot) is corruption:
:class:`CorruptStorage` is raised and nothing is used. The node refuses to start rather
than vote or serve with state it cannot trust.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import xxhash

from ..core.errors import TensorHubError
from ..core.raft import Entry, HardState, Snapshot
from .files import atomic_write, fsync_dir

WAL_MAGIC = b"RW"
SNAP_MAGIC = b"RS"
_REC = struct.Struct("!2sBIQ")
_SNAP = struct.Struct("!2sQQ")
T_READY, T_COMPACT = 1, 3
MAX_RECORD = 256 << 20
REWRITE_AFTER = 4096
"""Rewrite the WAL (dropping compacted entries) once this many records accumulated."""


class StorageError(TensorHubError):
    """The disk refused a write (full, read-only, failing): the node must stop."""


class CorruptStorage(TensorHubError):
    """Persisted Raft state failed its checks somewhere other than a torn tail."""


_enc = msgspec.msgpack.Encoder()
_ready_dec = msgspec.msgpack.Decoder(tuple[HardState | None, tuple[Entry, ...]])
_idx_dec = msgspec.msgpack.Decoder(tuple[int, int])
_snap_dec = msgspec.msgpack.Decoder(Snapshot)


def _checksum(kind: int, payload: bytes) -> int:
    return int(xxhash.xxh3_64_intdigest(bytes([kind]) + payload))


def _record(kind: int, payload: bytes) -> bytes:
    return _REC.pack(WAL_MAGIC, kind, len(payload), _checksum(kind, payload)) + payload


@dataclass
class Recovered:
    hard_state: HardState = field(default_factory=HardState)
    entries: list[Entry] = field(default_factory=list)
    snapshot: Snapshot | None = None
    truncated_bytes: int = 0


class RaftStorage:
    """Owns ``data_dir``; call :meth:`open` to recover, then :meth:`save` per Ready."""

    def __init__(self, data_dir: Path, fd: int, recovered: Recovered, records: int) -> None:
        self.dir = data_dir
        self._fd = fd
        self.recovered = recovered
        self._records = records
        self._snap_index = recovered.snapshot.index if recovered.snapshot else 0

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str]) -> RaftStorage:
        d = Path(data_dir)
        d.mkdir(parents=True, exist_ok=True)
        rec = Recovered(snapshot=_read_snapshot(d / "raft.snap"))
        wal = d / "raft.wal"
        records = 0
        if wal.exists():
            data = wal.read_bytes()
            good, records = _replay(data, rec)
            if good < len(data):
                rec.truncated_bytes = len(data) - good
                with open(wal, "r+b") as f:
                    f.truncate(good)
                    f.flush()
                    os.fsync(f.fileno())
        fd = os.open(wal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fsync_dir(d)
        return cls(d, fd, rec, records)

    def save(
        self,
        hard_state: HardState | None,
        entries: tuple[Entry, ...] | list[Entry],
        snapshot: Snapshot | None = None,
    ) -> None:
        """Persist one Ready's state (snapshot first, then entries, then hard state)."""
        if snapshot is not None:
            self.save_snapshot(snapshot)
        if hard_state is None and not entries:
            return
        self._write(_record(T_READY, _enc.encode((hard_state, tuple(entries)))))
        self._records += 1

    def save_snapshot(self, snap: Snapshot) -> None:
        """Atomically replace the snapshot, then mark the log compacted up to it."""
        payload = _enc.encode(snap)
        blob = _SNAP.pack(SNAP_MAGIC, len(payload), xxhash.xxh3_64_intdigest(payload)) + payload
        try:
            atomic_write(self.dir / "raft.snap", blob)
        except OSError as e:
            raise StorageError(f"cannot write snapshot in {self.dir}: {e}") from e
        self._snap_index = snap.index
        self._write(_record(T_COMPACT, _enc.encode((snap.index, snap.term))))

    def needs_rewrite(self) -> bool:
        return self._records > REWRITE_AFTER

    def rewrite(self, hard_state: HardState, entries: list[Entry]) -> None:
        """Replace the WAL by one holding only ``hard_state`` and the live ``entries``."""
        live = tuple(e for e in entries if e.index > self._snap_index)
        try:
            atomic_write(self.dir / "raft.wal", _record(T_READY, _enc.encode((hard_state, live))))
        except OSError as e:
            raise StorageError(f"cannot rewrite the log in {self.dir}: {e}") from e
        os.close(self._fd)
        self._fd = os.open(self.dir / "raft.wal", os.O_WRONLY | os.O_APPEND)
        self._records = 1

    def _write(self, data: bytes) -> None:
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            os.fsync(self._fd)
        except OSError as e:
            raise StorageError(f"cannot persist Raft state in {self.dir}: {e}") from e

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _read_snapshot(path: Path) -> Snapshot | None:
    if not path.exists():
        return None
    data = path.read_bytes()
    if len(data) < _SNAP.size:
        raise CorruptStorage(f"{path}: snapshot of {len(data)} bytes is truncated")
    magic, n, csum = _SNAP.unpack_from(data)
    payload = data[_SNAP.size :]
    if magic != SNAP_MAGIC or n != len(payload) or xxhash.xxh3_64_intdigest(payload) != csum:
        raise CorruptStorage(f"{path}: snapshot fails its checksum; refusing to use it")
    try:
        return _snap_dec.decode(payload)
    except (msgspec.DecodeError, ValueError) as e:
        raise CorruptStorage(f"{path}: undecodable snapshot: {e}") from None


def _replay(data: bytes, rec: Recovered) -> tuple[int, int]:
    """Apply every good record to ``rec``; return (bytes that are good, record count)."""
    pos = 0
    count = 0
    snap_index = rec.snapshot.index if rec.snapshot else 0
    while pos < len(data):
        if len(data) - pos < _REC.size:
            return pos, count  # torn header
        magic, kind, n, csum = _REC.unpack_from(data, pos)
        end = pos + _REC.size + n
        if magic != WAL_MAGIC or n > MAX_RECORD:
            if not any(data[pos:]):
                return pos, count  # zero fill after the last write: torn
            raise CorruptStorage(f"WAL record at byte {pos} has a bad header; refusing to start")
        if end > len(data):
            return pos, count  # torn payload
        payload = data[pos + _REC.size : end]
        if _checksum(kind, payload) != csum:
            if end == len(data):
                return pos, count  # the last record, half written
            raise CorruptStorage(f"WAL record at byte {pos} fails its checksum; refusing to start")
        try:
            if kind == T_READY:
                hs, ents = _ready_dec.decode(payload)
                if hs is not None:
                    rec.hard_state = hs
                if ents:
                    first = ents[0].index
                    rec.entries = [e for e in rec.entries if e.index < first]
                    rec.entries.extend(e for e in ents if e.index > snap_index)
            elif kind == T_COMPACT:
                snap_index, _term = _idx_dec.decode(payload)
                rec.entries = [e for e in rec.entries if e.index > snap_index]
            else:
                raise CorruptStorage(f"WAL record at byte {pos} has unknown type {kind}")
        except (msgspec.DecodeError, ValueError, IndexError) as e:
            raise CorruptStorage(f"WAL record at byte {pos} does not decode: {e}") from None
        pos = end
        count += 1
    if rec.snapshot is not None and snap_index < rec.snapshot.index:
        # Crash between replacing the snapshot and logging the marker: the snapshot wins.
        rec.entries = [e for e in rec.entries if e.index > rec.snapshot.index]
    if rec.entries and rec.entries[0].index != (rec.snapshot.index if rec.snapshot else 0) + 1:
        raise CorruptStorage(
            f"WAL entries start at {rec.entries[0].index}, not after the snapshot; refusing"
        )
    return pos, count

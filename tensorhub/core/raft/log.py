"""The replicated log: entries since the last snapshot, plus commit/apply/stable marks."""

from __future__ import annotations

from collections.abc import Sequence

from .types import Entry, Snapshot


class RaftLog:
    """Entries ``(snapshot.index, last]``; ``stabled`` marks what storage has persisted."""

    def __init__(self, snapshot: Snapshot | None = None, entries: Sequence[Entry] = ()) -> None:
        self.snapshot_index = snapshot.index if snapshot else 0
        self.snapshot_term = snapshot.term if snapshot else 0
        self.entries: list[Entry] = list(entries)
        if self.entries and self.entries[0].index != self.snapshot_index + 1:
            raise ValueError("entries do not follow the snapshot")
        self.committed = self.snapshot_index
        self.applied = self.snapshot_index
        self.stabled = self.last_index()
        self.pending_snapshot: Snapshot | None = None  # received, not yet persisted

    def first_index(self) -> int:
        return self.snapshot_index + 1

    def last_index(self) -> int:
        return self.entries[-1].index if self.entries else self.snapshot_index

    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else self.snapshot_term

    def term(self, i: int) -> int | None:
        """Term of entry ``i``; None if it is compacted away or beyond the end."""
        if i == self.snapshot_index:
            return self.snapshot_term
        if i < self.snapshot_index or i > self.last_index():
            return None
        return self.entries[i - self.snapshot_index - 1].term

    def match_term(self, i: int, term: int) -> bool:
        return self.term(i) == term

    def slice(self, lo: int, hi: int) -> list[Entry]:
        """Entries [lo, hi); lo must be > snapshot_index."""
        base = self.snapshot_index + 1
        return self.entries[lo - base : hi - base]

    def is_up_to_date(self, last_index: int, term: int) -> bool:
        """Whether a candidate's log (last_index, term) is at least as up to date as ours."""
        return term > self.last_term() or (
            term == self.last_term() and last_index >= self.last_index()
        )

    def find_conflict(self, ents: Sequence[Entry]) -> int:
        """Index of the first entry that is new or conflicts with ours; 0 if none."""
        for e in ents:
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The largest index ≤ ``index`` whose term ≤ ``term`` (etcd's fast log backtracking)."""
        while True:
            t = self.term(index)
            if t is None:
                return index, 0
            if t <= term:
                return index, t
            index -= 1

    def maybe_append(
        self, index: int, log_term: int, committed: int, ents: Sequence[Entry]
    ) -> int | None:
        """Follower side of AppendEntries; returns the last new index, or None to reject."""
        if not self.match_term(index, log_term):
            return None
        last_new = index + len(ents)
        ci = self.find_conflict(ents)
        if ci:
            if ci <= self.committed:
                raise AssertionError(f"entry {ci} conflicts with committed entry")
            self.append(ents[ci - (index + 1) :])
        self.commit_to(min(committed, last_new))
        return last_new

    def append(self, ents: Sequence[Entry]) -> int:
        """Append, truncating any conflicting suffix (which cannot be committed)."""
        if not ents:
            return self.last_index()
        after = ents[0].index - 1
        if after < self.committed:
            raise AssertionError(f"append after {after} is below commit {self.committed}")
        if after < self.last_index():
            del self.entries[after - self.snapshot_index :]
            self.stabled = min(self.stabled, after)
        self.entries.extend(ents)
        return self.last_index()

    def commit_to(self, index: int) -> None:
        if index > self.committed:
            if index > self.last_index():
                raise AssertionError(f"commit {index} beyond last index {self.last_index()}")
            self.committed = index

    def maybe_commit(self, index: int, term: int) -> bool:
        """Commit ``index`` only if it is from ``term`` (the leader's): Raft's figure-8 rule."""
        if index > self.committed and self.term(index) == term:
            self.commit_to(index)
            return True
        return False

    def unstable(self) -> list[Entry]:
        return (
            self.slice(self.stabled + 1, self.last_index() + 1)
            if self.stabled < self.last_index()
            else []
        )

    def next_committed(self) -> list[Entry]:
        lo = max(self.applied + 1, self.first_index())
        return self.slice(lo, self.committed + 1) if self.committed >= lo else []

    def restore(self, snap: Snapshot) -> None:
        """Replace the log with ``snap`` (a follower that is too far behind)."""
        self.entries = []
        self.snapshot_index, self.snapshot_term = snap.index, snap.term
        self.committed = snap.index
        self.stabled = snap.index
        self.pending_snapshot = snap

    def compact(self, index: int, term: int) -> None:
        """Drop entries up to ``index`` (the state machine has a snapshot there)."""
        if index <= self.snapshot_index:
            return
        if index > self.applied:
            raise ValueError(f"cannot compact to {index}: only {self.applied} applied")
        del self.entries[: index - self.snapshot_index]
        self.snapshot_index, self.snapshot_term = index, term

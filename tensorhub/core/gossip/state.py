"""Scuttlebutt-style anti-entropy of per-node key/value state, with bucketed digests.

Every node writes only its own keys (G3); each write bumps the node's version, so the pair
(generation, max_version) summarizes all it wrote. Peers reconcile in four steps — bucket
hashes, the digests of buckets that differ, then deltas both ways — so a sync between two
nodes that agree costs 64 integers, and work during convergence is proportional to what
differs, not to the cluster size. Deltas carry keys in version order, bounded in count;
tombstones are kept for a grace period, after which a peer too far behind gets a full reset
of that node's state instead of a delta (so a deleted key can never come back, G7). A node
that restarts gets a new generation: its old keys are dropped everywhere.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import xxhash

from .messages import DigestEntry, Kv, NodeDelta

Change = tuple[str, str, bytes | None]
"""(node, key, new value or None when deleted) — what the holder view listens to."""


def _entry_hash(name: str, generation: int, version: int) -> int:
    if version == 0:
        return 0  # a node that wrote nothing has nothing to reconcile
    return int(xxhash.xxh64_intdigest(f"{name}\0{generation}\0{version}".encode()))


def bucket_of(name: str, buckets: int) -> int:
    return zlib.crc32(name.encode()) % buckets  # stable across processes (unlike hash())


@dataclass
class NodeState:
    generation: int
    max_version: int = 0
    kvs: dict[str, Kv] = field(default_factory=dict)
    gc_version: int = 0  # tombstones at or below this version were purged
    tombstone_ticks: dict[str, int] = field(default_factory=dict)


class ScuttlebuttState:
    def __init__(
        self,
        me: str,
        generation: int,
        buckets: int = 64,
        max_kvs: int = 512,
        max_digest: int = 2048,
    ) -> None:
        self.me = me
        self.nbuckets = buckets
        self.max_kvs = max_kvs
        self.max_digest = max_digest
        self.nodes: dict[str, NodeState] = {}
        self._buckets = [0] * buckets
        self._members: list[set[str]] = [set() for _ in range(buckets)]
        self._add(me, NodeState(generation))

    # -- bookkeeping -------------------------------------------------------------------------

    def _add(self, name: str, st: NodeState) -> None:
        b = bucket_of(name, self.nbuckets)
        self.nodes[name] = st
        self._members[b].add(name)
        self._buckets[b] ^= _entry_hash(name, st.generation, st.max_version)

    def _bump(self, name: str, st: NodeState, version: int) -> None:
        b = bucket_of(name, self.nbuckets)
        self._buckets[b] ^= _entry_hash(name, st.generation, st.max_version)
        st.max_version = version
        self._buckets[b] ^= _entry_hash(name, st.generation, st.max_version)

    def generation(self, name: str) -> int | None:
        st = self.nodes.get(name)
        return st.generation if st is not None else None

    def drop(self, name: str) -> list[Change]:
        """Forget ``name``'s state (it died or restarted): its keys vanish everywhere here."""
        st = self.nodes.pop(name, None)
        if st is None or name == self.me:
            if st is not None:
                self.nodes[name] = st
            return []
        b = bucket_of(name, self.nbuckets)
        self._members[b].discard(name)
        self._buckets[b] ^= _entry_hash(name, st.generation, st.max_version)
        return [(name, k, None) for k, kv in st.kvs.items() if not kv.deleted]

    # -- own writes --------------------------------------------------------------------------

    def set(self, key: str, value: bytes, now: int = 0) -> None:
        st = self.nodes[self.me]
        v = st.max_version + 1
        st.kvs[key] = Kv(key, value, v)
        st.tombstone_ticks.pop(key, None)
        self._bump(self.me, st, v)

    def delete(self, key: str, now: int = 0) -> None:
        st = self.nodes[self.me]
        if key not in st.kvs or st.kvs[key].deleted:
            return
        v = st.max_version + 1
        st.kvs[key] = Kv(key, b"", v, deleted=True)
        st.tombstone_ticks[key] = now
        self._bump(self.me, st, v)

    def get(self, node: str, key: str) -> bytes | None:
        st = self.nodes.get(node)
        kv = st.kvs.get(key) if st else None
        return kv.value if kv is not None and not kv.deleted else None

    def gc(self, now: int, grace: int) -> None:
        """Purge tombstones older than ``grace`` ticks, ours and those peers sent us.

        Safe for a peer's key: a purged tombstone leaves the node's ``max_version`` as it
        was, so no older value of the key is ever accepted again (only newer versions
        are), and ``gc_version`` makes us send a reset to any peer too far behind."""
        for st in self.nodes.values():
            old = [k for k, t in st.tombstone_ticks.items() if now - t >= grace]
            for k in old:
                st.gc_version = max(st.gc_version, st.kvs[k].version)
                del st.kvs[k]
                del st.tombstone_ticks[k]

    # -- reconciliation ----------------------------------------------------------------------

    def buckets(self) -> tuple[int, ...]:
        return tuple(self._buckets)

    def differing(self, theirs: tuple[int, ...]) -> tuple[int, ...]:
        if len(theirs) != self.nbuckets:
            return tuple(range(self.nbuckets))
        return tuple(i for i in range(self.nbuckets) if theirs[i] != self._buckets[i])

    def digest(self, buckets: Iterable[int]) -> tuple[tuple[DigestEntry, ...], tuple[int, ...]]:
        """Our entries for ``buckets``, whole buckets only, at most ``max_digest`` entries."""
        out: list[DigestEntry] = []
        covered = []
        for b in buckets:
            names = self._members[b]
            if out and len(out) + len(names) > self.max_digest:
                break
            covered.append(b)
            for n in sorted(names):
                st = self.nodes[n]
                if st.max_version:
                    out.append(DigestEntry(n, st.generation, st.max_version))
        return tuple(out), tuple(covered)

    def deltas_for(
        self, theirs: Iterable[DigestEntry], buckets: Iterable[int]
    ) -> tuple[NodeDelta, ...]:
        """What a peer with digest ``theirs`` (covering ``buckets``) lacks, bounded."""
        known = {e.name: e for e in theirs}
        out: list[NodeDelta] = []
        budget = self.max_kvs
        for b in buckets:
            for name in sorted(self._members[b]):
                if budget <= 0:
                    return tuple(out)
                st = self.nodes[name]
                e = known.get(name)
                if st.max_version == 0:
                    continue
                if e is not None and (
                    e.generation > st.generation
                    or (e.generation == st.generation and e.max_version >= st.max_version)
                ):
                    continue
                reset = e is None or e.generation < st.generation or e.max_version < st.gc_version
                since = 0 if reset else e.max_version  # type: ignore[union-attr]
                kvs = sorted(
                    (
                        kv
                        for kv in st.kvs.values()
                        if kv.version > since and not (reset and kv.deleted)
                    ),
                    key=lambda kv: kv.version,
                )
                if len(kvs) > budget and not reset:
                    kvs = kvs[:budget]
                    top = kvs[-1].version
                else:
                    top = st.max_version
                budget -= max(len(kvs), 1)
                out.append(NodeDelta(name, st.generation, tuple(kvs), top, reset))
        return tuple(out)

    def apply(
        self, deltas: Iterable[NodeDelta], accept: Callable[[str, int], bool], now: int = 0
    ) -> list[Change]:
        """Merge deltas (never about ourselves; only those ``accept(name, generation)`` admits).

        A tombstone learnt from a peer is purged ``grace`` ticks after it arrived here
        (:meth:`gc`), as the owner purges its own: before session 8 only owners purged,
        so every node kept every other node's tombstones for ever (13 nodes, a 4 MiB
        version a second, 3 kept: 81 keys after 6 versions, 508 after 40)."""
        changes: list[Change] = []
        for d in deltas:
            if d.name == self.me or not accept(d.name, d.generation):
                continue
            st = self.nodes.get(d.name)
            if st is not None and d.generation < st.generation:
                continue  # a previous life of that node: ignore
            if st is None or d.generation > st.generation or d.reset:
                if (
                    st is not None
                    and d.generation == st.generation
                    and d.max_version <= st.max_version
                ):
                    continue  # a reset no newer than what we hold
                if st is not None:
                    changes.extend(self.drop(d.name))
                st = NodeState(d.generation)
                self._add(d.name, st)
            elif d.max_version <= st.max_version:
                continue
            for kv in d.kvs:
                cur = st.kvs.get(kv.key)
                if cur is not None and cur.version >= kv.version:
                    continue
                st.kvs[kv.key] = kv
                if kv.deleted:
                    st.tombstone_ticks[kv.key] = now
                else:
                    st.tombstone_ticks.pop(kv.key, None)
                changes.append((d.name, kv.key, None if kv.deleted else kv.value))
            self._bump(d.name, st, max(st.max_version, d.max_version))
        return changes

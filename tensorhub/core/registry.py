"""The version registry: the state machine Raft replicates.

It records, per model, which versions are committed with which manifest roots, which are
still collecting shards, which are retained by whom, and which are retired. Rules (each
violation is a clear rejection, never a silent overwrite):

- a (model, version, shard) maps to one manifest root forever; publishing the same root
  again is an idempotent success, a different one is a conflict;
- a version is committed when all its ``num_shards`` shards are published, and only if it is
  newer than the model's latest committed version: committed versions strictly increase;
- publishing a shard of a version at or below the latest committed one (that is not that
  committed version itself) is refused as stale;
- only committed, unretired versions can be retained; the latest version and retained
  versions cannot be retired.

Commands are msgpack-encoded :class:`Proposal` s; :meth:`Registry.apply` is deterministic.

**Each request applies once.** A proposal can reach the log twice (a client retrying on
another voter, a voter re-proposing on a new leader, a duplicated message), and retain,
release and retire are not idempotent once other commands interleave (retain, release,
duplicated retain: the version stays retained). So a proposal names its client session
and a sequence number in it, and the registry remembers, per session, the results of its
last ``SESSION_WINDOW`` requests (Raft dissertation §6.3): a request seen before gets its
first result again and changes nothing. Sessions are bounded (``MAX_SESSIONS``, the least
recently used dropped first) and travel in snapshots. A client may have at most
``SESSION_WINDOW`` requests outstanding at once.
"""

from __future__ import annotations

from typing import Union

import msgspec

from .errors import TensorHubError


class RegistryError(TensorHubError):
    """A registry command was rejected (the message says why)."""


class PublishShard(msgspec.Struct, frozen=True, tag="publish", forbid_unknown_fields=True):
    model: str
    version: int
    shard: int
    num_shards: int
    root: bytes
    publisher: str
    nbytes: int = 0


class Retain(msgspec.Struct, frozen=True, tag="retain", forbid_unknown_fields=True):
    model: str
    version: int
    holder: str


class Release(msgspec.Struct, frozen=True, tag="release", forbid_unknown_fields=True):
    model: str
    version: int
    holder: str


class Retire(msgspec.Struct, frozen=True, tag="retire", forbid_unknown_fields=True):
    model: str
    version: int


Command = Union[PublishShard, Retain, Release, Retire]  # noqa: UP007


SESSION_WINDOW = 256
"""Results remembered per client session (its most recent requests)."""
MAX_SESSIONS = 4096
"""Client sessions remembered at once (a process incarnation is one session)."""


class Proposal(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A command plus the proposer's request id (``req``, to find its result), and its
    session and sequence number (``client``, ``seq``: to apply it once). ``seq`` 0 opts
    out of deduplication (tests of the raw state machine)."""

    req: str
    cmd: Command
    client: str = ""
    seq: int = 0


class ClientSession:
    """Numbers one client's proposals within its session, so that each applies once.
    ``name`` must be unique per process incarnation (the caller draws it: randomness is
    an input here), or a restarted client's requests would read as old duplicates."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._seq = 0

    def proposal(self, cmd: Command) -> Proposal:
        self._seq += 1
        return Proposal(f"{self.name}#{self._seq}", cmd, self.name, self._seq)


class Result(msgspec.Struct, frozen=True):
    ok: bool
    code: str = "ok"
    message: str = ""
    committed: bool = False  # for PublishShard: this shard completed the version


class Shard(msgspec.Struct):
    root: bytes
    publisher: str
    nbytes: int


class VersionRecord(msgspec.Struct):
    num_shards: int
    shards: dict[int, Shard] = msgspec.field(default_factory=dict)
    committed_at: int = 0  # Raft index at which the version committed; 0 = pending
    retained: list[str] = msgspec.field(default_factory=list)
    retired: bool = False

    @property
    def committed(self) -> bool:
        return self.committed_at > 0

    def roots(self) -> tuple[bytes, ...]:
        return tuple(self.shards[i].root for i in range(self.num_shards))

    def publishers(self) -> tuple[str, ...]:
        return tuple(self.shards[i].publisher for i in range(self.num_shards))


class ModelRecord(msgspec.Struct):
    latest: int = 0
    versions: dict[int, VersionRecord] = msgspec.field(default_factory=dict)


class Session(msgspec.Struct):
    """One client's recent requests: their results, and the sequence number at or below
    which a request not among them is known to be old (applied and forgotten)."""

    results: dict[int, Result] = msgspec.field(default_factory=dict)
    floor: int = 0
    touched: int = 0  # log index of its last request (least recently used goes first)


class _State(msgspec.Struct):
    applied: int
    models: dict[str, ModelRecord]
    sessions: dict[str, Session] = msgspec.field(default_factory=dict)


_proposal_enc = msgspec.msgpack.Encoder()
_proposal_dec = msgspec.msgpack.Decoder(Proposal)
_state_dec = msgspec.msgpack.Decoder(_State)


def encode_proposal(p: Proposal) -> bytes:
    return _proposal_enc.encode(p)


def decode_proposal(data: bytes) -> Proposal:
    try:
        return _proposal_dec.decode(data)
    except (msgspec.DecodeError, ValueError) as e:
        raise RegistryError(f"malformed registry command: {e}") from None


class Registry:
    """The replicated state: apply committed commands in log order, answer queries."""

    def __init__(self) -> None:
        self.models: dict[str, ModelRecord] = {}
        self.sessions: dict[str, Session] = {}
        self.applied = 0

    # -- commands ----------------------------------------------------------------------------

    def apply(self, index: int, data: bytes) -> tuple[str, Result] | None:
        """Apply the entry at ``index``; returns (request id, result), None for a no-op."""
        if index <= self.applied:
            raise AssertionError(f"entry {index} applied twice (applied={self.applied})")
        self.applied = index
        if not data:
            return None
        try:
            p = decode_proposal(data)
        except RegistryError as e:
            return "", Result(False, "malformed", str(e))
        if p.seq <= 0:
            return p.req, self._apply(index, p.cmd)
        sess = self.sessions.get(p.client)
        if sess is not None:
            seen = sess.results.get(p.seq)
            if seen is not None:
                sess.touched = index
                return p.req, seen  # a duplicate: its first result, nothing applied
            if p.seq <= sess.floor:
                return p.req, Result(
                    False, "duplicate", f"request {p.req} was applied long ago (result dropped)"
                )
        else:
            sess = self._new_session(p.client)
        result = self._apply(index, p.cmd)
        sess.results[p.seq] = result
        sess.touched = index
        if len(sess.results) > SESSION_WINDOW:
            oldest = min(sess.results)
            del sess.results[oldest]
            sess.floor = max(sess.floor, oldest)
        return p.req, result

    def _new_session(self, client: str) -> Session:
        if len(self.sessions) >= MAX_SESSIONS:
            lru = min(self.sessions.items(), key=lambda kv: (kv[1].touched, kv[0]))[0]
            del self.sessions[lru]
        sess = self.sessions[client] = Session()
        return sess

    def _apply(self, index: int, cmd: Command) -> Result:
        if isinstance(cmd, PublishShard):
            return self._publish(index, cmd)
        m = self.models.get(cmd.model)
        rec = m.versions.get(cmd.version) if m else None
        name = f"{cmd.model} v{cmd.version}"
        if m is None or rec is None or not rec.committed:
            return Result(False, "unknown_version", f"{name} is not committed")
        if isinstance(cmd, Release):
            if cmd.holder in rec.retained:
                rec.retained.remove(cmd.holder)
            return Result(True)
        if rec.retired:
            return Result(False, "retired", f"{name} is retired")
        if isinstance(cmd, Retain):
            if cmd.holder not in rec.retained:
                rec.retained.append(cmd.holder)
                rec.retained.sort()
            return Result(True)
        if cmd.version == m.latest:
            return Result(False, "latest", f"{name} is the latest version and cannot retire")
        if rec.retained:
            return Result(False, "retained", f"{name} is retained by {rec.retained}")
        rec.retired = True
        return Result(True)

    def _publish(self, index: int, c: PublishShard) -> Result:
        name = f"{c.model} v{c.version}"
        if c.version < 1 or c.num_shards < 1 or not 0 <= c.shard < c.num_shards:
            return Result(False, "invalid", f"{name}: shard {c.shard}/{c.num_shards} is invalid")
        if len(c.root) != 16:
            return Result(False, "invalid", f"{name}: root of {len(c.root)} bytes")
        m = self.models.setdefault(c.model, ModelRecord())
        rec = m.versions.get(c.version)
        if rec is not None:
            if rec.num_shards != c.num_shards:
                return Result(
                    False, "conflict", f"{name} has {rec.num_shards} shards, not {c.num_shards}"
                )
            have = rec.shards.get(c.shard)
            if have is not None:
                if have.root != c.root:
                    return Result(
                        False, "conflict", f"{name} shard {c.shard} is already {have.root.hex()}"
                    )
                return Result(True, "already", committed=rec.committed)
        if c.version <= m.latest:
            return Result(False, "stale", f"{name} is not newer than committed v{m.latest}")
        if rec is None:
            rec = m.versions[c.version] = VersionRecord(c.num_shards)
        rec.shards[c.shard] = Shard(c.root, c.publisher, c.nbytes)
        if len(rec.shards) < rec.num_shards:
            return Result(True)
        rec.committed_at = index
        m.latest = c.version
        # Pending versions below the new latest can never commit now: drop them.
        for v in [v for v, r in m.versions.items() if v < c.version and not r.committed]:
            del m.versions[v]
        return Result(True, committed=True)

    # -- queries -----------------------------------------------------------------------------

    def latest(self, model: str) -> int:
        m = self.models.get(model)
        return m.latest if m else 0

    def version(self, model: str, version: int) -> VersionRecord | None:
        m = self.models.get(model)
        rec = m.versions.get(version) if m else None
        return rec if rec is not None and rec.committed else None

    def committed_versions(self, model: str) -> list[int]:
        m = self.models.get(model)
        return sorted(v for v, r in m.versions.items() if r.committed) if m else []

    # -- snapshots ---------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        return msgspec.msgpack.encode(_State(self.applied, self.models, self.sessions))

    @classmethod
    def restore(cls, data: bytes) -> Registry:
        try:
            st = _state_dec.decode(data)
        except (msgspec.DecodeError, ValueError) as e:
            raise RegistryError(f"corrupt registry snapshot: {e}") from None
        r = cls()
        r.applied, r.models, r.sessions = st.applied, st.models, st.sessions
        return r

"""Raft's data on the wire and on disk: entries, hard state, snapshots, messages."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import msgspec

from ..messages import Message, register


class MsgType(IntEnum):
    APP = 1
    APP_RESP = 2
    VOTE = 3
    VOTE_RESP = 4
    PRE_VOTE = 5
    PRE_VOTE_RESP = 6
    HEARTBEAT = 7
    HEARTBEAT_RESP = 8
    SNAP = 9
    TIMEOUT_NOW = 10
    PROP = 11
    READ_INDEX = 12
    READ_INDEX_RESP = 13
    TRANSFER_LEADER = 14


class Entry(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    term: int
    index: int
    data: bytes = b""
    """Empty data is the no-op a new leader appends; the state machine skips it."""


class HardState(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """What must be durable before any message that depends on it is sent."""

    term: int = 0
    vote: str | None = None
    commit: int = 0


class Snapshot(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    index: int
    term: int
    data: bytes
    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()


@register
class RaftMessage(Message, frozen=True, tag="raft"):
    """One Raft message (etcd style: one struct, the type says which fields matter)."""

    type: MsgType
    frm: str
    to: str
    term: int = 0
    log_term: int = 0
    index: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    context: bytes = b""
    snapshot: Snapshot | None = None


@dataclass(frozen=True)
class ReadState:
    """A linearizable read may be served once the state machine applied ``index``."""

    index: int
    context: bytes

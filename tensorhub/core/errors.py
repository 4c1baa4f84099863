"""Exception types shared by the cores and the drivers.

Each names one failure a caller can act on; messages say what was wrong and with what value.
"""

from __future__ import annotations


class TensorHubError(Exception):
    """Base class of every error tensorhub raises on purpose."""


class ManifestError(TensorHubError, ValueError):
    """A manifest (or a layout request) is inconsistent, malformed or does not match."""


class ProtocolError(TensorHubError, ValueError):
    """A peer sent a malformed, oversized, unknown or out-of-order frame."""


class AuthenticationError(TensorHubError):
    """The peer did not prove knowledge of the cluster secret (or we could not)."""


class UnknownVersion(TensorHubError, KeyError):
    """A version is not known where it was asked for: not committed (or retired) in the
    registry, or not held by the node asked. The message says which."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown version"


class ChecksumMismatch(TensorHubError):
    """Bytes received for a chunk do not hash to the digest in the manifest."""


class NoQuorum(TensorHubError):
    """The version registry could not commit or read in time (no leader, voters unreachable)."""


class DeadlineExceeded(TensorHubError, TimeoutError):
    """A call ran past the timeout its caller gave; the work it started was cancelled."""


class TransferError(TensorHubError):
    """A transfer could not complete: the peer vanished, refused or timed out."""


class Refused(TransferError):
    """A super-seeding holder would not send this chunk again yet: ``holders`` got it."""

    def __init__(self, peer: str | None, chunk: int, holders: list[str]) -> None:
        super().__init__(f"{peer}: chunk {chunk} already sent to {holders}")
        self.holders = holders


class RemoteError(TransferError):
    """The peer answered a request with an error; ``code`` says which (e.g. "no_chunk",
    "unknown_version"): the peer is alive, it just does not have what was asked."""

    def __init__(self, peer: str | None, code: str, message: str) -> None:
        super().__init__(f"{peer}: {code}: {message}")
        self.code = code

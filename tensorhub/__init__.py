"""tensorhub: reference-oriented storage for LLM RL weight transfer.

A trainer publishes a version of its weights; nothing is copied into a store; rollout
workers fetch it from whoever holds it and become holders themselves.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .core.errors import (
    AuthenticationError,
    ChecksumMismatch,
    DeadlineExceeded,
    ManifestError,
    NoQuorum,
    ProtocolError,
    TensorHubError,
    TransferError,
    UnknownVersion,
)
from .core.manifest import Manifest
from .dataplane.node import Node
from .hub import Hub, NoHolder, Published, PublishRejected, SyncHub

__all__ = [
    "AuthenticationError",
    "Hub",
    "NoHolder",
    "NoQuorum",
    "PublishRejected",
    "Published",
    "SyncHub",
    "UnknownVersion",
    "ChecksumMismatch",
    "DeadlineExceeded",
    "Manifest",
    "ManifestError",
    "Node",
    "ProtocolError",
    "TensorHubError",
    "TransferError",
    "__version__",
]

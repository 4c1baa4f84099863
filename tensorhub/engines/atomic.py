"""Atomic updates: an engine's weights change only once a whole version is verified.

A fetch straight into an engine's live tensors writes each chunk as it arrives, so a fetch
that fails half way (its last holder killed, a deadline) leaves the engine torn: half the
old version, half the new. :class:`StagedWeights` fetches into a staging twin instead and
copies it over the live tensors only after every chunk verified; a failed update leaves
the live tensors as they were, bit for bit, and :attr:`StagedWeights.version` still names
the version they hold (for per-request attribution, as vLLM's ``weight_version``).

The staging twin is a full copy (host memory by default), and it is a holder: after an
update this node serves the version from it to other fetchers, until the next update
fetches into it (the Hub's mutability contract then withdraws the old version, keeping a
CPU copy first if it was the last one of a retained or latest version).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import torch

from ..dataplane.fetch import FetchResult
from ..hub import Hub, SyncHub


def _twin(live: Mapping[str, torch.Tensor], device: torch.device | str) -> dict[str, torch.Tensor]:
    """Empty tensors like ``live`` on ``device``, tied where ``live`` is tied (a tied
    weight is published once, so the fetch wants the tie)."""
    out: dict[str, torch.Tensor] = {}
    seen: dict[tuple[object, ...], str] = {}
    for name, t in live.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype) if t.numel() else None
        if key is not None and key in seen and live[seen[key]].shape == t.shape:
            out[name] = out[seen[key]]
            continue
        out[name] = torch.empty(t.shape, dtype=t.dtype, device=device)
        if key is not None:
            seen[key] = name
    return out


class StagedWeights:
    """``live``: the engine's tensors (any device), named as the published version.
    ``staging``: where the twin lives (``"cpu"``: host memory, as the publisher's snapshot).

    Not a lock against the engine: pause generation around :meth:`update`'s final copy
    (as engines do around any weight load), or read :attr:`version` per request."""

    def __init__(self, live: Mapping[str, torch.Tensor], *, staging: str = "cpu") -> None:
        self.live = dict(live)
        self.staging = _twin(self.live, staging)
        self.version: int | None = None
        """The version the live tensors hold (None: not loaded by tensorhub yet)."""
        self.model: str | None = None
        self._lock = threading.Lock()

    async def update(
        self, hub: Hub, model: str, version: int, *, shard: int = 0, timeout: float = 60.0
    ) -> FetchResult:
        """Fetch ``version`` into the staging twin, then (only if every byte verified)
        copy it over the live tensors. On any error the live tensors are untouched."""
        res = await hub.fetch(model, version, self.staging, shard=shard, timeout=timeout)
        self._apply(model, version)
        return res

    def update_sync(
        self, hub: SyncHub, model: str, version: int, *, shard: int = 0, timeout: float = 60.0
    ) -> FetchResult:
        """:meth:`update` for code that is not async."""
        res = hub.fetch(model, version, self.staging, shard=shard, timeout=timeout)
        self._apply(model, version)
        return res

    def _apply(self, model: str, version: int) -> None:
        with self._lock, torch.no_grad():
            done: set[int] = set()
            for name, dest in self.live.items():
                src = self.staging[name]
                if id(src) in done:
                    continue  # a tie: its target's copy filled it
                dest.copy_(src, non_blocking=False)
                done.add(id(src))
            self.model, self.version = model, version

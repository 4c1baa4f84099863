"""Accelerator tensors on a host-memory wire: pinned staging, copies overlapped with transfer.

Every transport carries host memory, and every chunk is verified (BLAKE3-128) and served to
other peers from host memory, so a CUDA tensor is never a chunk's direct source or sink:

* **publishing** CUDA tensors takes a pinned host snapshot of them at publish time (one
  device-to-host copy at PCIe rate). The version then stays intact while the trainer goes
  on updating its weights in place, and serving it never touches the GPU;
* **fetching** into CUDA tensors lands each chunk in a pinned host mirror and, the moment
  the chunk is verified, queues its host-to-device copy on a side stream, so the copies run
  under the network transfer and ``fetch`` returns one chunk's copy after the last byte. The
  mirror stays as the replica this worker serves to others.

Pinned memory is taken as one arena per replica and registered with ``cudaHostRegister``
(exact size; torch's pinned allocator rounds each allocation up to a power of two, up to
twice the memory at model scale). A dropped replica's arena is kept for the next fetch of
the same size (the next version), since pinning costs more than the copy it speeds up.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every device's context, not one
_ALIGN = 64


def on_host(t: torch.Tensor) -> bool:
    return t.device.type == "cpu"


@dataclass(eq=False)  # identity: a pool entry is this very block
class _Block:
    """Host memory, and what it takes to reuse or free it safely."""

    memory: torch.Tensor
    registered: bool
    fences: dict[torch.cuda.Stream, torch.cuda.Event] = field(default_factory=dict)
    users: int = -1  # references to the memory when nothing else used it (-1: unknown)

    def idle(self) -> bool:
        """Nothing outside the pool still refers to the memory: no view, no memoryview a
        send in progress holds. Unknown (torch without the count) counts as in use."""
        return self.users >= 0 and _users(self.memory) == self.users

    def quiet(self) -> None:
        """Wait until no copy queued from this memory is still reading it."""
        for event in self.fences.values():
            event.synchronize()
        self.fences.clear()


_POOL: deque[_Block] = deque()
POOL_SIZE = 2
"""Freed registered arenas kept for reuse. A rollout fetches every version into the same
tensors, so the next fetch asks for the same size, and pinning (faulting in and locking
every page) is otherwise the slowest step of a fetch to the GPU."""


def _users(t: torch.Tensor) -> int:
    count = getattr(torch._C, "_storage_Use_Count", None)
    return -1 if count is None else int(count(t.untyped_storage()._cdata))


def _pin(nbytes: int) -> _Block:
    memory = torch.empty(nbytes, dtype=torch.uint8)
    if nbytes == 0 or not torch.cuda.is_available():
        return _Block(memory, registered=False)
    cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    if int(cudart.cudaHostRegister(memory.data_ptr(), nbytes, _PORTABLE)) != 0:
        # Refused (some sandboxes): torch's own pinned allocator, which pools by itself.
        return _Block(torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), False)
    return _Block(memory, registered=True, users=_users(memory))


def _take(nbytes: int) -> _Block | None:
    for block in _POOL:
        if block.memory.numel() == nbytes and block.idle():
            _POOL.remove(block)
            block.quiet()
            return block
    return None


def _release(block: _Block) -> None:
    _POOL.append(block)
    while len(_POOL) > POOL_SIZE:
        old = _POOL.popleft()
        old.quiet()
        torch.cuda.cudart().cudaHostUnregister(old.memory.data_ptr())  # type: ignore[no-untyped-call]


class PinnedArena:
    """``nbytes`` of page-locked host memory as a flat uint8 tensor, :attr:`memory`.

    Whoever uses views of :attr:`memory` keeps the arena. When the arena is freed its
    memory goes back to a small pool (:data:`POOL_SIZE`); it is reused only once no view
    of it is left (a send may still read a dropped replica), and leaves the pool
    unregistered only after every copy queued from it has finished. Falls back to torch's pinned
    allocator where registration is refused, and to pageable memory without CUDA."""

    def __init__(self, nbytes: int) -> None:
        self._block = _take(nbytes) or _pin(nbytes)
        self.memory = self._block.memory
        self.registered = self._block.registered
        if self.registered:
            weakref.finalize(self, _release, self._block)

    def fence(self, stream: torch.cuda.Stream) -> None:
        """Copies were queued on ``stream`` from this memory: remember their end."""
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(stream)
        self._block.fences[stream] = event

    @classmethod
    def carve(cls, like: Sequence[torch.Tensor]) -> tuple[PinnedArena, Iterator[torch.Tensor]]:
        """One arena for host twins of ``like`` (same dtype and shape, contiguous), and
        the twins in order. Each starts 64-byte aligned, so any dtype can view it."""
        sizes = [t.numel() * t.element_size() for t in like]
        starts = [0]
        for n in sizes:
            starts.append(starts[-1] + -(-n // _ALIGN) * _ALIGN)
        arena = cls(starts[-1])
        twins = (
            arena.memory[a : a + n].view(t.dtype).view(t.shape)
            for t, a, n in zip(like, starts, sizes, strict=False)
        )
        return arena, twins


def current_streams(tensors: Iterable[torch.Tensor]) -> list[torch.cuda.Stream]:
    """The calling thread's current CUDA stream on each device among ``tensors``. Current
    streams are per thread: work handed to another thread (:func:`snapshot` in a worker)
    must run on these (:func:`on_streams`), or its copies would not be ordered after the
    caller's writes on a side stream."""
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    return [torch.cuda.current_stream(d) for d in sorted(devices, key=str)]


@contextlib.contextmanager
def on_streams(streams: Sequence[torch.cuda.Stream]) -> Iterator[None]:
    """Make ``streams`` (see :func:`current_streams`) this thread's current ones."""
    with contextlib.ExitStack() as stack:
        for s in streams:
            stack.enter_context(torch.cuda.stream(s))
        yield


def snapshot(tensors: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], PinnedArena]:
    """Contiguous pinned host copies of device tensors (host tensors are returned as is),
    all copied at once and synchronized before return, so hashing can begin. The copies
    are views of the returned arena: keep it as long as them."""
    device = [t for t in tensors if not on_host(t)]
    arena, slots = PinnedArena.carve(device)
    out: list[torch.Tensor] = []
    devices: set[torch.device] = set()
    for t in tensors:
        if on_host(t):
            out.append(t)
            continue
        host = next(slots)
        if t.device.type == "cuda":
            host.copy_(t, non_blocking=True)  # pinned: an async DMA on t's current stream
            devices.add(t.device)
        else:
            host.copy_(t)  # another accelerator: a plain copy
        out.append(host)
    for d in devices:
        torch.cuda.current_stream(d).synchronize()
    return out, arena


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


@dataclass
class _Staged:
    host: torch.Tensor  # flat uint8, pinned
    dev: torch.Tensor  # flat uint8 view of the caller's device tensor
    stream: torch.cuda.Stream


class DeviceCopies:
    """Per-chunk host-to-device copies for the device destinations of one replica."""

    def __init__(self, arena: PinnedArena) -> None:
        self._arena = arena
        self._staged: dict[int, _Staged] = {}
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def __bool__(self) -> bool:
        return bool(self._staged)

    def add(self, index: int, host: torch.Tensor, dev: torch.Tensor) -> None:
        """Tensor ``index`` of the layout lands in ``host`` and belongs in ``dev``."""
        stream = self._streams.get(dev.device)
        if stream is None:
            stream = torch.cuda.Stream(dev.device)  # type: ignore[no-untyped-call]
            self._streams[dev.device] = stream
            # Work the caller queued on the destination (still reading the old weights,
            # say) finishes before our copies overwrite it.
            stream.wait_stream(torch.cuda.current_stream(dev.device))
        self._staged[index] = _Staged(_flat(host), _flat(dev), stream)

    def copy(self, segments: Iterable[tuple[int, int, int]]) -> None:
        """Queue the copies of (tensor, start, length) byte ranges whose host bytes are
        final (verified); returns at once."""
        used: set[torch.cuda.Stream] = set()
        for index, start, length in segments:
            s = self._staged.get(index)
            if s is None:
                continue
            end = start + length
            with torch.cuda.stream(s.stream):
                s.dev[start:end].copy_(s.host[start:end], non_blocking=True)
            used.add(s.stream)
        for stream in used:
            self._arena.fence(stream)

    def wait(self) -> None:
        """Block until every queued copy is in device memory."""
        for stream in self._streams.values():
            stream.synchronize()

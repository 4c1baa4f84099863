"""The Ray backend's event channel loses nothing and keeps each sender's order.

Nodes put without waiting (a blocking put stalled their event loops under CPU contention),
and the reader polls with timeouts far shorter than a round trip, so a ``take`` is often
still outstanding when ``get`` gives up: every event must still arrive, once, in each
sender's order.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the dev extra installs ray")
pytestmark = pytest.mark.xdist_group("ray")  # one local Ray cluster at a time (make test)

from tensorhub.launch.ray_backend import RayEvents  # noqa: E402

EVENTS = 1500


@ray.remote(num_cpus=0)
class _Sender:
    def send(self, out: Any, who: str, n: int) -> None:
        for i in range(n):
            out.put({"who": who, "i": i})  # returns at once: no round trip per event


@ray.remote(num_cpus=0)
class _BusyBox:
    """The mailbox's interface, and a way to keep it busy."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def hold(self, seconds: float) -> None:
        time.sleep(seconds)

    def put(self, item: Any) -> None:
        self.items.append(item)

    def take(self) -> list[Any]:
        items, self.items = self.items, []
        return items


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.timeout(300)
def test_every_event_arrives_in_each_senders_order(local_ray: None) -> None:
    out = RayEvents()
    senders = [_Sender.remote() for _ in range(2)]  # type: ignore[attr-defined]
    done = [s.send.remote(out, f"s{k}", EVENTS) for k, s in enumerate(senders)]
    got: dict[str, list[int]] = {"s0": [], "s1": []}
    empties = 0
    deadline = time.monotonic() + 240
    while sum(map(len, got.values())) < 2 * EVENTS and time.monotonic() < deadline:
        try:
            ev = out.get(timeout=0.001)
        except queue.Empty:
            empties += 1
            continue
        got[ev["who"]].append(ev["i"])
    ray.get(done)
    print(f"timeouts while reading: {empties}")
    assert got == {"s0": list(range(EVENTS)), "s1": list(range(EVENTS))}
    with pytest.raises(queue.Empty):
        out.get(timeout=0.2)  # nothing extra, nothing repeated


@pytest.mark.timeout(120)
def test_a_put_does_not_wait_for_the_mailbox(local_ray: None) -> None:
    """Nodes put from inside their event loop: a put that waited for the mailbox's answer
    (as ``ray.util.queue.Queue``'s does) would stall the node for as long as Ray is slow."""
    out = RayEvents()
    out._box = box = _BusyBox.remote()  # type: ignore[attr-defined]
    ray.get(box.take.remote())  # started
    held = box.hold.remote(5.0)  # the put below queues behind this
    t0 = time.monotonic()
    out.put({"i": 1})
    took = time.monotonic() - t0
    print(f"put returned in {took * 1000:.1f} ms while the mailbox was busy for 5 s")
    assert took < 2.5
    ray.get(held)
    assert out.get(timeout=30) == {"i": 1}

"""A Hub inside Ray actors an RL framework already holds: voters as actors, a trainer
actor publishing, two rollout actors fetching, on a local Ray cluster."""

from __future__ import annotations

from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the dev extra installs ray")

from tensorhub.engines.ray_actors import hub_in_actor, start_voters  # noqa: E402
from tensorhub.io.tensors import empty_like_manifest, tensor_digests  # noqa: E402
from tensorhub.testing.weights import llm_like_state_dict  # noqa: E402

SECRET = "ray-actors-secret"


@ray.remote(num_cpus=0)
class Worker:
    def __init__(self, seeds: list[str], dc: str) -> None:
        self.hub = hub_in_actor(seeds, secret=SECRET, dc=dc)
        self.weights: dict[str, Any] = {}

    def locality(self) -> str:
        return self.hub.hub.locality

    def publish(self, version: int) -> dict[str, str]:
        self.weights = llm_like_state_dict(8 << 20, seed=version)
        self.hub.publish("policy", version, self.weights)
        return tensor_digests(self.weights)

    def fetch(self, version: int) -> dict[str, str]:
        into = empty_like_manifest(self.hub.manifest("policy", version))
        self.hub.fetch("policy", version, into)
        return tensor_digests(into)


@pytest.mark.timeout(300)
def test_hubs_inside_ray_actors() -> None:
    ray.init(num_cpus=2, include_dashboard=False, resources={"tensorhub-dc-dc1": 100})
    try:
        seeds, _voters = start_voters(secret=SECRET)
        trainer = Worker.remote(seeds, "dc1")
        rollouts = [Worker.remote(seeds, dc) for dc in ("dc1", None)]
        locs = ray.get([r.locality.remote() for r in rollouts])
        assert locs[0].startswith("dc1/node-") and locs[1].startswith("dc1/node-")  # resource
        want = ray.get(trainer.publish.remote(1))
        got = ray.get([r.fetch.remote(1) for r in rollouts])
        assert got == [want, want]
    finally:
        ray.shutdown()

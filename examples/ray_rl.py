"""tensorhub inside Ray actors, as an RL framework that already places its workers holds them.

The driver starts the version registry (3 voter actors); a trainer actor publishes a
version per step; rollout actors, each with a Hub of its own, load every version (the
first ones from the trainer, later ones also from each other) and report what they hold.

    python examples/ray_rl.py --rollouts 3 --steps 3             # a local Ray cluster
    python examples/ray_rl.py --address auto                      # a running one
"""

from __future__ import annotations

import argparse
from typing import Any

import ray
import torch

from tensorhub.engines.ray_actors import hub_in_actor, start_voters, stop_voters
from tensorhub.io.tensors import empty_like_manifest, tensor_digests

SECRET = "ray-example-secret"


@ray.remote(num_cpus=0)
class Trainer:
    def __init__(self, seeds: list[str]) -> None:
        self.hub = hub_in_actor(seeds, secret=SECRET, name="trainer")
        torch.manual_seed(0)
        self.weights = {f"layer{i}.weight": torch.randn(1024, 1024) for i in range(8)}

    def step(self, version: int) -> dict[str, str]:
        """One "optimizer step", then publish it (a CPU copy: train on at once)."""
        for w in self.weights.values():
            w.add_(torch.randn_like(w), alpha=1e-3)
        snapshot = {n: w.to(torch.bfloat16) for n, w in self.weights.items()}
        self.hub.publish("policy", version, snapshot)
        if version > 1:
            self.hub.unpublish("policy", version - 1)
        return tensor_digests(snapshot)


@ray.remote(num_cpus=0)
class Rollout:
    def __init__(self, seeds: list[str], name: str) -> None:
        self.hub = hub_in_actor(seeds, secret=SECRET, name=name)
        self.weights: dict[str, Any] | None = None

    def load(self, version: int) -> tuple[str, dict[str, str], dict[str, int]]:
        if self.weights is None:  # allocated once, reused for every version
            self.weights = empty_like_manifest(self.hub.manifest("policy", version))
        res = self.hub.fetch("policy", version, self.weights)
        return self.hub.hub.locality, tensor_digests(self.weights), res.sources


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", default=None, help="a Ray cluster (default: start one here)")
    ap.add_argument("--rollouts", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    # A local cluster is one machine: say it is datacenter dc1 (a Ray node offering the
    # resource tensorhub-dc-<dc> puts its tensorhub nodes in <dc>).
    local = {"tensorhub-dc-dc1": 100} if args.address is None else None
    ray.init(address=args.address, include_dashboard=False, resources=local)
    voters: list[object] = []
    try:
        seeds, voters = start_voters(secret=SECRET)
        trainer = Trainer.remote(seeds)
        rollouts = [Rollout.remote(seeds, f"rollout{i}") for i in range(args.rollouts)]
        for v in range(1, args.steps + 1):
            want = ray.get(trainer.step.remote(v))
            for where, got, sources in ray.get([r.load.remote(v) for r in rollouts]):
                status = "ok" if got == want else "WRONG WEIGHTS"
                print(f"v{v} at {where}: {status}, bytes by source {sources}", flush=True)
                if got != want:
                    raise SystemExit(1)
    finally:
        if voters and not stop_voters(voters):  # (killed, they would leave their logs)
            print("a voter did not stop in time: its log stays in the temp dir", flush=True)
        ray.shutdown()


if __name__ == "__main__":
    main()

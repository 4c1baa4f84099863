"""A rollout process for tests/test_engines_hf.py: builds its own HF Llama from the config
(different random weights), streams a version into it in place with tensorhub, measures
its resident memory meanwhile, generates, and prints one JSON line.

    python -m tests.hf_rollout_proc '{"seeds": [...], "secret": ..., "config": {...}, ...}'
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import torch


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Samples resident memory every 0.2 ms on a thread until stopped: the peak."""

    def __init__(self) -> None:
        self.peak = rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(0.0002)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return max(self.peak, rss())


def main() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from tensorhub import SyncHub
    from tensorhub.engines import hf

    args = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    torch.manual_seed(12345)  # not the trainer's weights
    model = LlamaForCausalLM(LlamaConfig(**args["config"])).to(torch.bfloat16).eval()
    prompt = torch.tensor([args["prompt"]])
    loads = []
    with SyncHub(
        name="hf-rollout", locality="dc0/rack9/r", seeds=args["seeds"], secret=args["secret"]
    ) as hub:
        for version in args["versions"]:
            hub.manifest(args["model"], version)  # connections and the manifest: not the stream
            before = rss()
            peak = PeakRss()
            report = hf.load_sync(
                hub, args["model"], version, model, bucket_bytes=args["bucket_bytes"]
            )
            extra = peak.stop() - before
            with torch.no_grad():
                out = model.generate(prompt, max_new_tokens=24, do_sample=False)
                logits = model(prompt).logits
            loads.append(
                {
                    "version": version,
                    "peak_extra": extra,
                    "buckets": report.buckets,
                    "largest_bucket": report.largest_bucket,
                    "bytes": report.bytes,
                    "tokens": out[0].tolist(),
                    "logits": logits.float().sum().item(),
                }
            )
    print(json.dumps(loads))


if __name__ == "__main__":
    main()

"""Session 49's one-off: bench/linerate.py with ``net.ipv4.tcp_slow_start_after_idle`` set
to ``SSAI`` (0 or 1) in every namespace of the fabric (a new namespace starts at the
kernel's default, 1, whatever the host's is). Run from the repository root, as root:

    SSAI=0 python docs/results/linerate/session49/ssai.py --receivers 8 --case slow --steps 2 ...
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from tensorhub.testing import netns  # noqa: E402

_build = netns.Fabric._build


def build(self: netns.Fabric) -> None:
    _build(self)
    value = os.environ["SSAI"]
    for i in range(self.nodes):
        subprocess.run(
            ["ip", "netns", "exec", self.ns(i), "sysctl", "-qw",
             f"net.ipv4.tcp_slow_start_after_idle={value}"],
            check=True,
        )  # fmt: skip


netns.Fabric._build = build  # type: ignore[method-assign]
sys.argv = [str(ROOT / "bench/linerate.py"), *sys.argv[1:]]
runpy.run_path(str(ROOT / "bench/linerate.py"), run_name="__main__")

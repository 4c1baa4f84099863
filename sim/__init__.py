"""The discrete-event simulator of whole clusters, on the real tensorhub cores.

``python -m sim reproduce`` runs the paper's three workloads (standalone, elastic, cross-DC
rollouts) against their baselines and lower bounds; ``python -m sim sweep`` moves each
assumed parameter and writes ``docs/results.md``. The data plane is the real chunk planner,
super-seeder and upload slots on a flow-level max-min network (``swarm.py``,
``network.py``); each publish's commit and gossip run on the real Raft and gossip cores
(``control.py``). See ``docs/architecture.md`` for the model and its assumptions.
"""

import os as _os

if _os.environ.get("TENSORHUB_SIM_NATIVE", "") not in ("", "0"):
    from . import native as _native

    _native.enable()  # the compiled network, engine and planner (sim/native.py), first

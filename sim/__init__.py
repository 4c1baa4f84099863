"""The discrete-event simulator of whole clusters (virtual clock, flow-level network).

Built so far: the engine (``engine.py``: virtual clock, event heap, deterministic order,
a trace hash) and the flow-level network (``network.py``: links, flows, max-min fair
sharing by progressive filling), both tested. Not built yet: the simulated node drivers
that run the real cores (planner, super-seeding, upload slots, Raft, gossip) on them, the
paper's workloads, the baselines and the ``python -m sim`` CLI (issue #6). Meanwhile the
protocol cores are simulated one protocol at a time by the harnesses in
``tensorhub.testing`` (``raft_cluster``, ``gossip_cluster``).
"""

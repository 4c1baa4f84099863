"""The discrete-event simulator of whole clusters (virtual clock, flow-level network).

Built so far: the engine (``engine.py``: virtual clock, event heap, deterministic order,
a trace hash), the flow-level network (``network.py``: links, flows, max-min fair
sharing by progressive filling), the topology (``topology.py``) and one version's data
plane (``swarm.py``) run by the real planner, super-seeder and upload slots. Not built yet
(issue #6): fidelity at scale (a broadcast takes 1.8-2.0x its lower bound, not 1.15x),
Raft and gossip cores in the simulated nodes, the paper's workloads and baselines, and
the ``python -m sim`` CLI. Meanwhile the protocol cores are simulated one protocol at a
time by the harnesses in ``tensorhub.testing`` (``raft_cluster``, ``gossip_cluster``).
"""

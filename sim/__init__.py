"""The discrete-event simulator of whole clusters (virtual clock, flow-level network).

Not built yet. Today the protocol cores are simulated one protocol at a time by the
harnesses in ``tensorhub.testing`` (``raft_cluster``, ``gossip_cluster``), which drive the
same core objects the real drivers use.
"""

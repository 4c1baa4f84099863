"""The control plane's drivers: a Raft voter (raft_driver.py) and registry access from any
node (registry_client.py), gossip (gossip_driver.py), and the per-peer queues both send
through (outbox.py). Their cores are core/raft/, core/registry.py and core/gossip/."""

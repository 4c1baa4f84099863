"""The data plane's drivers: one node's connections (node.py), the protocol on each of them
(peer.py), what it holds (store.py), upload slots (uploads.py), and fetching from one peer
(fetch.py) or from many (swarm.py). The policy they run is in core/swarm/."""

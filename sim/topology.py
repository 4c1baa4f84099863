"""Simulated datacenters: hosts with NICs, racks behind oversubscribed ToR uplinks, a WAN.

A path from host a to host b crosses a's NIC uplink, a's rack uplink (if b is in another
rack), the WAN link from a's datacenter to b's (if another datacenter), b's rack downlink
and b's NIC downlink. Capacities are effective rates: line rate times ``efficiency`` (the
paper measured 22 GB/s on ~25 GB/s RDMA, 0.88).

Across the WAN a path also crosses its *connection*: one TCP connection per host pair
(what the node and a naive puller open), which moves at most a receive window per round
trip however idle the WAN is. Without it a single stream would fill a 30 ms WAN, which TCP
does not do with the kernel's default windows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tensorhub.core.gossip.holders import tier

from .network import Link

GB = 1e9


@dataclass(frozen=True)
class TopologySpec:
    dcs: int = 1
    racks_per_dc: int = 16
    hosts_per_rack: int = 8
    nic_gbytes: float = 25.0  # per host, each direction (GB/s line rate)
    efficiency: float = 0.88
    oversubscription: float = 2.0  # rack uplink = hosts x NIC / this
    wan_gbytes: float = 1.25  # per direction between two datacenters (10 Gbit/s)
    wan_rtt: float = 0.03  # seconds
    hop_latency: float = 5e-6  # per network hop inside a datacenter
    # The largest receive window a WAN connection reaches, MiB: Linux's default
    # net.ipv4.tcp_rmem maximum is 6 MiB (6291456), so one connection at 30 ms RTT moves at
    # most ~210 MB/s. 0: no per-connection limit (the WAN link alone).
    wan_window_mib: float = 6.0

    @property
    def wan_connection(self) -> float:
        """One TCP connection's ceiling across the WAN, bytes/s (inf: none)."""
        if self.wan_window_mib <= 0:
            return float("inf")
        return self.wan_window_mib * 2**20 / self.wan_rtt


@dataclass
class Host:
    name: str
    dc: int
    rack: int
    up: Link
    down: Link

    @property
    def locality(self) -> str:
        return f"dc{self.dc}/rack{self.rack}/{self.name}"


@dataclass
class Cluster:
    spec: TopologySpec
    hosts: dict[str, Host] = field(default_factory=dict)
    rack_up: dict[tuple[int, int], Link] = field(default_factory=dict)
    rack_down: dict[tuple[int, int], Link] = field(default_factory=dict)
    wan: dict[tuple[int, int], Link] = field(default_factory=dict)
    connections: dict[tuple[str, str], Link] = field(default_factory=dict)  # WAN, lazily
    # Whether a rack's uplinks can bind: not when its hosts' NIC links together cannot fill
    # them (hosts capped below line rate), so paths leave them out (the same max-min rates,
    # fewer links per flow, and flows of one rack no longer all stale together).
    racks_bind: bool = True

    @classmethod
    def build(cls, spec: TopologySpec, host_rate: float | None = None) -> Cluster:
        """``host_rate`` (bytes/s) caps every host's NIC links below the line rate: what a
        host's software moves (the node over TCP) when that is slower than its NIC. Rack
        uplinks keep the physical rate: the fabric is the same, only the endpoints slow."""
        c = cls(spec)
        phys = spec.nic_gbytes * GB * spec.efficiency
        nic = phys if host_rate is None else min(phys, host_rate)
        rack_bw = spec.hosts_per_rack * phys / spec.oversubscription
        c.racks_bind = spec.hosts_per_rack * nic > rack_bw
        for d in range(spec.dcs):
            for r in range(spec.racks_per_dc):
                c.rack_up[(d, r)] = Link(f"dc{d}/rack{r}/up", rack_bw)
                c.rack_down[(d, r)] = Link(f"dc{d}/rack{r}/down", rack_bw)
                for h in range(spec.hosts_per_rack):
                    name = f"h{d}.{r}.{h}"
                    c.hosts[name] = Host(
                        name, d, r, Link(f"{name}/up", nic), Link(f"{name}/down", nic)
                    )
            for e in range(spec.dcs):
                if e != d:
                    c.wan[(d, e)] = Link(f"wan/dc{d}>dc{e}", spec.wan_gbytes * GB)
        return c

    def in_dc(self, dc: int) -> list[str]:
        return [n for n, h in self.hosts.items() if h.dc == dc]

    def path(self, a: str, b: str) -> list[Link]:
        ha, hb = self.hosts[a], self.hosts[b]
        path = [ha.up]
        other_rack = self.racks_bind and (ha.dc, ha.rack) != (hb.dc, hb.rack)
        if other_rack:
            path.append(self.rack_up[(ha.dc, ha.rack)])
        if ha.dc != hb.dc:
            path.append(self.wan[(ha.dc, hb.dc)])
            if self.spec.wan_window_mib > 0:
                path.append(self._connection(a, b))
        if other_rack:
            path.append(self.rack_down[(hb.dc, hb.rack)])
        path.append(hb.down)
        return path

    def _connection(self, a: str, b: str) -> Link:
        """The TCP connection from a to b (one per ordered pair, shared by its flows)."""
        link = self.connections.get((a, b))
        if link is None:
            link = Link(f"tcp/{a}>{b}", self.spec.wan_connection)
            self.connections[(a, b)] = link
        return link

    def latency(self, a: str, b: str) -> float:
        """One-way propagation delay from a to b."""
        ha, hb = self.hosts[a], self.hosts[b]
        if ha.dc != hb.dc:
            return self.spec.wan_rtt / 2
        hops = 2 if ha.rack == hb.rack else 4
        return hops * self.spec.hop_latency

    def tier(self, a: str, b: str) -> int:
        return tier(self.hosts[a].locality, self.hosts[b].locality)

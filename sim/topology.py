"""Simulated datacenters: hosts with NICs, racks behind oversubscribed ToR uplinks, a WAN.

A path from host a to host b crosses a's NIC uplink, a's rack uplink (if b is in another
rack), the WAN link from a's datacenter to b's (if another datacenter), b's rack downlink
and b's NIC downlink. Capacities are effective rates: line rate times ``efficiency`` (the
paper measured 22 GB/s on ~25 GB/s RDMA, 0.88).
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

    @classmethod
    def build(cls, spec: TopologySpec) -> Cluster:
        c = cls(spec)
        nic = spec.nic_gbytes * GB * spec.efficiency
        rack_bw = spec.hosts_per_rack * nic / spec.oversubscription
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
        other_rack = (ha.dc, ha.rack) != (hb.dc, hb.rack)
        if other_rack:
            path.append(self.rack_up[(ha.dc, ha.rack)])
        if ha.dc != hb.dc:
            path.append(self.wan[(ha.dc, hb.dc)])
        if other_rack:
            path.append(self.rack_down[(hb.dc, hb.rack)])
        path.append(hb.down)
        return path

    def latency(self, a: str, b: str) -> float:
        """One-way propagation delay from a to b."""
        ha, hb = self.hosts[a], self.hosts[b]
        if ha.dc != hb.dc:
            return self.spec.wan_rtt / 2
        hops = 2 if ha.rack == hb.rack else 4
        return hops * self.spec.hop_latency

    def tier(self, a: str, b: str) -> int:
        return tier(self.hosts[a].locality, self.hosts[b].locality)

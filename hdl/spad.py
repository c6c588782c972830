"""On-chip memories behind their clients: multi-port (simulation) or banked dual-port block RAM.

Used for the scratchpad (lane words) and the accumulators (rows of `bus_bytes`). Units reach a
memory through *clients* declared up front: each reads or writes `lanes`
consecutive lane words (`lanes` bytes each) at a lane-word index, asks with `en`, is told `grant`
the same cycle, and a reader gets its words the cycle after the grant (registered reads). A unit
whose request is refused asks again the next cycle (it stalls).

`MultiPortScratchpad` gives every client its own ports and grants everything: one array, right for
simulation, but FPGA block RAM has two ports. `BankedScratchpad` (`spad_banked` configurations) is
the block-RAM design chosen with `npu bench banks`: the
scratchpad's two halves (activations below, weights above) each hold `banks_per_region` banks of
`lanes`-byte words, lane word `g` of a half living in bank `g mod P`, row `g div P` (P prime, so
power-of-two strides never put two rows of a tile into one bank). Every bank is one memory with two
ports, A and B, each of which reads (registered, data the next cycle) or writes one word a cycle: a
true dual-port block RAM.

Clients are declared up front, each on one port, in priority order, reading or writing `lanes`
consecutive lane words at once (1 for a matrix operand row, `bus_bytes / lanes` for a bus word).
Each cycle a port grants its clients in order, all-or-nothing: a client is granted when it asks and
none of its banks is taken by a client before it. A refused client asks again (the unit stalls).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu.arith import cdiv
from npu.config import NpuConfig

from .common import log2, tree


@dataclass(frozen=True)
class Client:
    name: str
    port: str  # "A" or "B"
    write: bool
    lanes: int = 1  # consecutive lane words per access


def reciprocal(divisor: int, bits: int) -> tuple[int, int]:
    """(M, s) with x // divisor == (x * M) >> s for every x < 2**bits (checked)."""
    s = bits + divisor.bit_length()
    m = cdiv((1 << s), divisor)
    x = np.arange(1 << bits, dtype=np.int64)
    assert np.array_equal((x * m) >> s, x // divisor), (divisor, bits)
    return m, s


def gather(
    m: Module, ports: list, need: list, active, ready=1, name: str = "op", holds: tuple = ()
) -> tuple[Signal, list]:
    """Ask through read clients `ports` for the words `need`s marks, again each cycle for those still
    refused, while `ready`. Returns (done, words): `done` is high in the cycle the last needed word is
    granted (and `active`); `words` hold every word the cycle after `done` (words granted earlier wait
    in registers, but for the ports `holds` marks: their data holds by itself until the next
    `ready`)."""
    got = Signal(len(ports), name=f"{name}_got")  # granted in an earlier cycle of this step
    granted = Cat(*[p.grant for p in ports])
    m.d.comb += [p.en.eq(need[r] & ~got[r] & ready) for r, p in enumerate(ports)]
    done = Signal(name=f"{name}_done")
    m.d.comb += done.eq(active & ready & (got | granted | ~Cat(*need)).all())
    with m.If(done):
        m.d.sync += got.eq(0)
    with m.Else():
        m.d.sync += got.eq(got | (granted & Cat(*[p.en for p in ports])))
    fresh = Signal(len(ports), name=f"{name}_fresh")
    m.d.sync += fresh.eq(Cat(*[p.en & p.grant for p in ports]))
    words = []
    for r, port in enumerate(ports):
        if r < len(holds) and holds[r]:
            words.append(port.data)
            continue
        held = Signal(len(port.data), name=f"{name}_held{r}")
        with m.If(fresh[r]):
            m.d.sync += held.eq(port.data)
        words.append(Mux(fresh[r], port.data, held))
    return done, words


def shared_client(m: Module, port, count: int, name: str) -> list:
    """`count` clients of a unit over one client `port` of a memory, served in turn: each cycle the
    lowest that asks is passed through (its request, and its grant back) and the others are
    refused, so they ask again. A reader gets the port's data the cycle after its own grant."""
    write = hasattr(port, "be")
    clients = []
    for i in range(count):
        c = SimpleNamespace(
            addr=Signal.like(port.addr, name=f"{name}{i}_addr"),
            en=Signal(name=f"{name}{i}_en"),
            grant=Signal(name=f"{name}{i}_grant"),
            data=Signal.like(port.data, name=f"{name}{i}_data") if write else port.data,
        )
        if write:
            c.be = Signal.like(port.be, name=f"{name}{i}_be")
        clients.append(c)
    with m.If(clients[0].en):
        _pass_through(m, port, clients[0], write)
    for c in clients[1:]:
        with m.Elif(c.en):
            _pass_through(m, port, c, write)
    return clients


def _pass_through(m: Module, port, client, write: bool) -> None:
    m.d.comb += [port.addr.eq(client.addr), port.en.eq(1), client.grant.eq(port.grant)]
    if write:
        m.d.comb += [port.data.eq(client.data), port.be.eq(client.be)]


def client_signature(words: int, width: int, write: bool) -> wiring.Signature:
    """A request/grant port of one client, seen from the unit: `en` requests word `addr`; `grant`
    says it is served this cycle. A reader gets `data` the next cycle (registered read); a writer
    gives `data` with byte enables `be`."""
    members = {
        "addr": Out(range(words)),
        "en": Out(1),
        "grant": In(1),
        "data": Out(width) if write else In(width),
    }
    if write:
        members["be"] = Out(width // 8)
    return wiring.Signature(members)


def _clients_signature(clients: list[Client], words: int, lane_bytes: int) -> dict:
    """The memory's members: one flipped client port per client, named after it."""
    return {c.name: In(client_signature(words, 8 * lane_bytes * c.lanes, c.write)) for c in clients}


class MultiPortScratchpad(wiring.Component):
    """`size` bytes as one array of lane words with ports for every client; every request is granted."""

    def __init__(self, size: int, lane_bytes: int, clients: list[Client]):
        self.size, self.L, self.words = size, lane_bytes, size // lane_bytes
        self.clients = clients
        super().__init__(_clients_signature(clients, self.words, lane_bytes))

    def elaborate(self, platform):
        m = Module()
        L = self.L
        m.submodules.array = mem = Memory(shape=unsigned(8 * L), depth=self.words, init=[])
        writers = {
            c.name: [mem.write_port(granularity=8) for _ in range(c.lanes)] for c in self.clients if c.write
        }
        for c in self.clients:
            addr, en = getattr(self, c.name).addr, getattr(self, c.name).en
            m.d.comb += getattr(self, c.name).grant.eq(en)
            if c.write:
                data, be = getattr(self, c.name).data, getattr(self, c.name).be
                for k, wp in enumerate(writers[c.name]):
                    m.d.comb += [
                        wp.addr.eq(addr + k),
                        wp.data.eq(data[8 * L * k : 8 * L * (k + 1)]),
                        wp.en.eq(Mux(en, be[L * k : L * (k + 1)], 0)),
                    ]
            else:
                words = []
                for k in range(c.lanes):
                    rp = mem.read_port(domain="sync")
                    m.d.comb += rp.addr.eq(addr + k)
                    words.append(rp.data)
                m.d.comb += getattr(self, c.name).data.eq(Cat(*words))
        return m


class BankedScratchpad(wiring.Component):
    """`size` bytes of `lane_bytes`-byte words in 2 regions x `banks_per_region` dual-port banks.

    Per client `c`: `c_addr` (lane-word index), `c_en`, `c_grant` (this cycle); a reader's `c_data`
    holds the words the cycle after the grant; a writer gives `c_data` and byte enables `c_be`.
    """

    def __init__(self, size: int, lane_bytes: int, banks_per_region: int, clients: list[Client]):
        self.size, self.L, self.P = size, lane_bytes, banks_per_region
        self.words = size // lane_bytes
        self.half = self.words // 2
        assert self.half & (self.half - 1) == 0, "each region must hold a power of two of lane words"
        for c in clients:
            assert c.port in ("A", "B") and 1 <= c.lanes <= banks_per_region, c
        self.clients = clients
        self.depth = cdiv(self.half, banks_per_region)
        super().__init__(_clients_signature(clients, self.words, lane_bytes))

    def bank_of(self, g: int) -> tuple[int, int]:
        """(bank, row) of lane word `g`: banks 0..P-1 hold the lower region, P..2P-1 the upper."""
        region, local = divmod(g, self.half)
        return region * self.P + local % self.P, local // self.P

    def elaborate(self, platform):
        m = Module()
        L, P = self.L, self.P
        nb = 2 * P
        hb = log2(self.half)
        mul, sh = reciprocal(P, hb)
        # a port with only readers gets a read port, one with only writers a write port (the core
        # reads on A and writes on B: each bank is a simple dual-port block RAM, which every FPGA
        # family has); a port with both reads and writes at one address (true dual-port)
        used = {p: {c.write for c in self.clients if c.port == p} for p in ("A", "B")}
        banks = []
        for b in range(nb):
            mem = Memory(shape=unsigned(8 * L), depth=self.depth, init=[])
            m.submodules[f"bank{b}"] = mem
            ports = {}
            for p in ("A", "B"):
                wp = mem.write_port(granularity=8) if True in used[p] else None
                rp = mem.read_port(domain="sync") if False in used[p] else None
                if wp is not None and rp is not None:
                    m.d.comb += rp.addr.eq(wp.addr)
                ports[p] = (wp or rp, wp, rp)  # (the memory port taking the address, write, read)
            banks.append(ports)

        # every client's lane words: bank and row
        lanes = {}
        for c in self.clients:
            addr = getattr(self, c.name).addr
            local = Signal(hb, name=f"{c.name}_local")
            region = Signal(name=f"{c.name}_region")
            m.d.comb += [local.eq(addr[:hb]), region.eq(addr[hb])]
            row0 = Signal(range(self.depth + 1), name=f"{c.name}_row0")
            bank0 = Signal(range(P), name=f"{c.name}_bank0")
            if P & (P - 1) == 0:  # a power of two: bank and row are bit fields
                m.d.comb += [row0.eq(local >> log2(P)), bank0.eq(local[: log2(P)] if P > 1 else 0)]
            else:
                m.d.comb += [row0.eq((local * mul) >> sh), bank0.eq(local - row0 * P)]
            ls = []
            for k in range(c.lanes):
                wrap = bank0 + k >= P
                bank = Signal(range(nb), name=f"{c.name}_bank{k}")
                row = Signal(range(self.depth + 1), name=f"{c.name}_row{k}")
                m.d.comb += [
                    bank.eq(region * P + Mux(wrap, bank0 + k - P, bank0 + k)),
                    row.eq(row0 + wrap),
                ]
                ls.append((bank, row))
            lanes[c.name] = ls

        onehot = {}  # a single-bank client's bank, one-hot
        for c in self.clients:
            if c.lanes == 1:
                oh = Signal(nb, name=f"{c.name}_onehot")
                m.d.comb += oh.eq(Cat(*[lanes[c.name][0][0] == b for b in range(nb)]))
                onehot[c.name] = oh

        # per port: grant in priority order, all-or-nothing over a client's banks
        for port in ("A", "B"):
            taken = Const(0, nb)
            on_port = [c for c in self.clients if c.port == port]
            single = all(c.lanes == 1 for c in on_port)
            # each bank port's inputs: an OR of the granted clients' (grants are exclusive per bank),
            # a balanced tree rather than a chain of priority multiplexers
            drive = {b: [] for b in range(nb)}
            for i, c in enumerate(on_port):
                grant = getattr(self, c.name).grant
                en = getattr(self, c.name).en
                if single:
                    # every client asks for one bank: a higher client asking for the same bank always
                    # gets it, so the grants are independent compares instead of a chain (Fmax)
                    bank = lanes[c.name][0][0]
                    lost = Const(0, 1)
                    for h in on_port[:i]:
                        lost = lost | (getattr(self, h.name).en & (lanes[h.name][0][0] == bank))
                    m.d.comb += grant.eq(en & ~lost)
                else:
                    need = Signal(nb, name=f"{c.name}_need")
                    m.d.comb += need.eq(
                        Cat(*[Cat(*[bk == b for bk, _ in lanes[c.name]]).any() for b in range(nb)])
                    )
                    if all(h.lanes == 1 for h in on_port[:i]):
                        # behind single-bank clients only: the banks they take are the banks they
                        # ask for (one refused asks for a bank a client before it holds), an OR of
                        # requests rather than a chain of grants (Fmax)
                        asked = [Mux(getattr(self, h.name).en, onehot[h.name], 0) for h in on_port[:i]]
                        taken = tree(asked, operator.or_) if asked else Const(0, nb)
                    m.d.comb += grant.eq(en & ~(need & taken).any())
                    nxt = Signal(nb, name=f"{c.name}_taken")
                    m.d.comb += nxt.eq(taken | Mux(grant, need, 0))
                    taken = nxt
                for k, (bk, row) in enumerate(lanes[c.name]):
                    for b in range(nb):
                        sel = Signal(name=f"{c.name}_to{b}_{k}")
                        m.d.comb += sel.eq(grant & (bk == b))
                        if c.write:
                            data = getattr(self, c.name).data[8 * L * k : 8 * L * (k + 1)]
                            be = getattr(self, c.name).be[L * k : L * (k + 1)]
                            drive[b].append((sel, row, data, be))
                        else:
                            drive[b].append((sel, row, None, None))
            for b in range(nb):
                if not drive[b]:
                    continue
                ap, wp, _ = banks[b][port]
                m.d.comb += ap.addr.eq(tree([Mux(s_, r, 0) for s_, r, _, _ in drive[b]], operator.or_))
                if wp is not None:
                    writes = [(s_, d, e) for s_, _, d, e in drive[b] if d is not None]
                    m.d.comb += [
                        wp.data.eq(tree([Mux(s_, d, 0) for s_, d, _ in writes], operator.or_)),
                        wp.en.eq(tree([Mux(s_, e, 0) for s_, _, e in writes], operator.or_)),
                    ]
            for c in on_port:
                grant = getattr(self, c.name).grant
                # a reader's words arrive the next cycle from the banks it was granted
                if not c.write:
                    out = []
                    for k, (bk, _) in enumerate(lanes[c.name]):
                        sel = Signal(range(nb), name=f"{c.name}_sel{k}")
                        with m.If(grant):
                            m.d.sync += sel.eq(bk)
                        word = Signal(8 * L, name=f"{c.name}_word{k}")
                        with m.Switch(sel):
                            for b in range(nb):
                                with m.Case(b):
                                    m.d.comb += word.eq(banks[b][port][2].data)
                        out.append(word)
                    m.d.comb += getattr(self, c.name).data.eq(Cat(*out))
        return m


def onchip_memory(cfg: NpuConfig, mem: str, clients: list[Client]) -> wiring.Component:
    """The configuration's scratchpad (`mem` "spad": words of `lanes` bytes) or accumulator memory
    ("acc": words of `bus_bytes`) with these clients; banked when `spad_banked`."""
    size, word = (cfg.spad_bytes, cfg.lanes) if mem == "spad" else (cfg.acc_bytes, cfg.bus_bytes)
    if cfg.spad_banked:
        return BankedScratchpad(size, word, cfg.spad_banks // 2, clients)
    return MultiPortScratchpad(size, word, clients)

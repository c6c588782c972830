"""`NpuSoc(config)`: `config.engines` NpuCores behind one AXI4 port to DRAM and one AXI4-Lite port.

- `AxiInterconnect`: N AXI4 masters onto one slave. Read and write addresses are granted round-robin,
  one burst per grant, so no engine is starved and a long burst costs the others one burst's wait.
  The engine index is put above each master's id bits (ARID/AWID), and R/B beats are routed back by
  it, so masters may keep several bursts outstanding. Write data follows the order of the granted
  write addresses (AXI4 has no WID): a small FIFO holds the owner of each granted AW burst.
- `RegisterDecoder`: the AXI4-Lite port in windows of 256 bytes (npu/registers.py): window 0 is the
  SoC block (`SocRegisters`), window i + 1 engine i's register file; unmapped windows read zero and
  ignore writes, as unmapped registers do.
- Interrupts: one line per engine (`irqs`, each engine's own IRQ.PENDING and IRQ_ENABLE) and `irq`,
  their OR under the SoC block's IRQ_MASK.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig, get_config
from npu.registers import ISA_VERSION, SOC_ADDR_BITS, SOC_MAGIC, SOC_REG, WINDOW_BYTES

from .axi import AxiLiteSignature, AxiSignature
from .common import log2
from .core import dram_signature
from .engine import engine_core
from .regs import ADDR_BITS

#: AW bursts granted whose write data has not all passed (per interconnect)
W_ORDER_DEPTH = 4


def engine_bits(n: int) -> int:
    """Id bits the interconnect adds to tell `n` masters apart (at least one)."""
    return max(1, (n - 1).bit_length())


def soc_dram_signature(cfg: NpuConfig) -> AxiSignature:
    """The SoC's DRAM master: the engines' AXI4 with the engine index above their id bits."""
    core = dram_signature(cfg)
    return AxiSignature(
        data_width=core.data_width,
        addr_width=core.addr_width,
        id_width=core.id_width + engine_bits(cfg.engines),
    )


def soc_regs_signature() -> AxiLiteSignature:
    return AxiLiteSignature(addr_width=SOC_ADDR_BITS)


def round_robin(m: Module, requests: list, last) -> Signal:
    """The requester granted next: the first one asking after `last` (cyclically)."""
    n = len(requests)
    grant = Signal(range(max(2, n)))
    with m.Switch(last):
        for prev in range(n):
            with m.Case(prev):
                # the lowest priority first: a later assignment wins
                for k in reversed(range(1, n + 1)):
                    with m.If(requests[(prev + k) % n]):
                        m.d.comb += grant.eq((prev + k) % n)
    return grant


class AxiInterconnect(wiring.Component):
    """`masters[i]` (AXI4 slaves' side of each engine's master) onto `bus` (one AXI4 master)."""

    def __init__(self, n: int, master: AxiSignature):
        self.n = n
        self.ebits = engine_bits(n)
        self.master_sig = master
        bus = AxiSignature(
            data_width=master.data_width, addr_width=master.addr_width, id_width=master.id_width + self.ebits
        )
        super().__init__({"masters": In(master).array(n), "bus": Out(bus)})

    def _address_channel(self, m: Module, ch: str, room=None) -> tuple[Signal, Signal]:
        """Arbitrate AR or AW: the granted master's request goes to the bus and is held there until
        taken (AXI: a VALID shown may not change). Returns (selected master, handshake)."""
        n, bus, ms = self.n, self.bus, self.masters
        valid = [getattr(s, f"{ch}valid") for s in ms]
        last = Signal(range(max(2, n)), name=f"{ch}_last", init=n - 1)
        held = Signal(name=f"{ch}_held")
        held_sel = Signal(range(max(2, n)), name=f"{ch}_held_sel")
        grant = round_robin(m, valid, last)
        sel = Signal(range(max(2, n)), name=f"{ch}_sel")
        m.d.comb += sel.eq(Mux(held, held_sel, grant))
        ok = Const(1, 1) if room is None else room
        fields = ("addr", "len", "size", "burst")
        for i, s in enumerate(ms):
            with m.If(sel == i):
                m.d.comb += [getattr(bus, f"{ch}{f}").eq(getattr(s, f"{ch}{f}")) for f in fields]
                m.d.comb += [
                    getattr(bus, f"{ch}id").eq(Cat(getattr(s, f"{ch}id"), Const(i, self.ebits))),
                    getattr(bus, f"{ch}valid").eq(valid[i] & ok),
                    getattr(s, f"{ch}ready").eq(getattr(bus, f"{ch}ready") & ok),
                ]
        shown = getattr(bus, f"{ch}valid")
        taken = Signal(name=f"{ch}_taken")
        m.d.comb += taken.eq(shown & getattr(bus, f"{ch}ready"))
        with m.If(taken):
            m.d.sync += [held.eq(0), last.eq(sel)]
        with m.Elif(shown):
            m.d.sync += [held.eq(1), held_sel.eq(sel)]
        return sel, taken

    def _response_channel(self, m: Module, ch: str, fields: tuple[str, ...]) -> None:
        """R or B: each beat goes to the master named by the id's engine bits."""
        bus, iw = self.bus, self.master_sig.id_width
        rid = getattr(bus, f"{ch}id")
        owner = rid[iw:]
        for i, s in enumerate(self.masters):
            mine = owner == i
            m.d.comb += [getattr(s, f"{ch}{f}").eq(getattr(bus, f"{ch}{f}")) for f in fields]
            m.d.comb += [
                getattr(s, f"{ch}id").eq(rid[:iw]),
                getattr(s, f"{ch}valid").eq(getattr(bus, f"{ch}valid") & mine),
            ]
            with m.If(mine):
                m.d.comb += getattr(bus, f"{ch}ready").eq(getattr(s, f"{ch}ready"))

    def elaborate(self, platform):
        m = Module()
        bus, ms = self.bus, self.masters
        self._address_channel(m, "ar")
        self._response_channel(m, "r", ("data", "resp", "last"))

        # write data in the order of the granted AW bursts
        m.submodules.w_order = order = fifo.SyncFIFO(width=self.ebits, depth=W_ORDER_DEPTH)
        aw_sel, aw_taken = self._address_channel(m, "aw", room=order.w_rdy)
        m.d.comb += [order.w_en.eq(aw_taken), order.w_data.eq(aw_sel)]
        head = order.r_data
        for i, s in enumerate(ms):
            with m.If(head == i):
                m.d.comb += [
                    bus.wdata.eq(s.wdata),
                    bus.wstrb.eq(s.wstrb),
                    bus.wlast.eq(s.wlast),
                    bus.wvalid.eq(order.r_rdy & s.wvalid),
                ]
            m.d.comb += s.wready.eq(order.r_rdy & (head == i) & bus.wready)
        m.d.comb += order.r_en.eq(bus.wvalid & bus.wready & bus.wlast)
        self._response_channel(m, "b", ("resp",))
        return m


class SocRegisters(wiring.Component):
    """The SoC block: identity, engine count, interrupt status and mask (npu/registers.py)."""

    def __init__(self, cfg: NpuConfig):
        self.cfg = cfg
        n = cfg.engines
        super().__init__({"bus": In(AxiLiteSignature(addr_width=ADDR_BITS)), "lines": In(n), "irq": Out(1)})

    def elaborate(self, platform):
        m = Module()
        bus, n = self.bus, self.cfg.engines
        mask = Signal(n, init=(1 << n) - 1)
        m.d.comb += self.irq.eq((self.lines & mask).any())
        # writes: address and data together, one response
        take = Signal()
        m.d.comb += [
            take.eq(bus.awvalid & bus.wvalid & ~bus.bvalid),
            bus.awready.eq(take),
            bus.wready.eq(take),
        ]
        with m.If(take):
            m.d.sync += bus.bvalid.eq(1)
            with m.If(bus.awaddr == SOC_REG["IRQ_MASK"].offset):
                m.d.sync += mask.eq(bus.wdata)
        with m.Elif(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)
        # reads
        m.d.comb += bus.arready.eq(~bus.rvalid)
        with m.If(bus.arvalid & ~bus.rvalid):
            m.d.sync += [bus.rvalid.eq(1), bus.rdata.eq(0)]
            values = {
                "SOC_ID": SOC_MAGIC,
                "SOC_VERSION": ISA_VERSION,
                "SOC_CONFIG_ID": self.cfg.config_id,
                "ENGINES": n,
                "IRQ_STATUS": self.lines,
                "IRQ_MASK": mask,
            }
            with m.Switch(bus.araddr):
                for name, v in values.items():
                    with m.Case(SOC_REG[name].offset):
                        m.d.sync += bus.rdata.eq(v)
        with m.Elif(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        return m


class NullRegisters(wiring.Component):
    """An unmapped window: reads return zero, writes are accepted and ignored."""

    def __init__(self):
        super().__init__({"bus": In(AxiLiteSignature(addr_width=ADDR_BITS))})

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        take = Signal()
        m.d.comb += [
            take.eq(bus.awvalid & bus.wvalid & ~bus.bvalid),
            bus.awready.eq(take),
            bus.wready.eq(take),
        ]
        m.d.comb += [bus.arready.eq(~bus.rvalid), bus.rdata.eq(0)]
        with m.If(take):
            m.d.sync += bus.bvalid.eq(1)
        with m.Elif(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)
        with m.If(bus.arvalid & ~bus.rvalid):
            m.d.sync += bus.rvalid.eq(1)
        with m.Elif(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        return m


class RegisterDecoder(wiring.Component):
    """One AXI4-Lite slave (`host`) onto `windows` targets: target k gets the host's addresses
    [256 k, 256 (k + 1)) with the window bits removed; windows past the last target are unmapped
    (`NullRegisters`). One write and one read at a time: a transaction's response comes back from
    the window that took it before the next is accepted."""

    def __init__(self, windows: int):
        self.windows = windows
        super().__init__(
            {
                "host": In(soc_regs_signature()),
                "targets": Out(AxiLiteSignature(addr_width=ADDR_BITS)).array(windows),
            }
        )

    def elaborate(self, platform):
        m = Module()
        host, ts = self.host, self.targets
        lw = log2(WINDOW_BYTES)
        wsel, rsel = host.awaddr[lw:], host.araddr[lw:]
        w_busy, r_busy = Signal(), Signal()
        w_owner = Signal(len(wsel))
        r_owner = Signal(len(rsel))
        m.submodules.unmapped = null = NullRegisters()
        for k, t in enumerate([*ts, null.bus]):
            m.d.comb += [
                t.awaddr.eq(host.awaddr[:lw]),
                t.wdata.eq(host.wdata),
                t.wstrb.eq(host.wstrb),
                t.araddr.eq(host.araddr[:lw]),
            ]
            w_mine = (wsel == k) if k < self.windows else (wsel >= self.windows)
            r_mine = (rsel == k) if k < self.windows else (rsel >= self.windows)
            w_took = (w_owner == k) if k < self.windows else (w_owner >= self.windows)
            r_took = (r_owner == k) if k < self.windows else (r_owner >= self.windows)
            with m.If(~w_busy & w_mine):
                # both together: the register files take address and data in one cycle
                m.d.comb += [
                    t.awvalid.eq(host.awvalid & host.wvalid),
                    t.wvalid.eq(host.awvalid & host.wvalid),
                    host.awready.eq(t.awready),
                    host.wready.eq(t.wready),
                ]
            with m.If(w_busy & w_took):
                m.d.comb += [host.bvalid.eq(t.bvalid), host.bresp.eq(t.bresp), t.bready.eq(host.bready)]
            with m.If(~r_busy & r_mine):
                m.d.comb += [t.arvalid.eq(host.arvalid), host.arready.eq(t.arready)]
            with m.If(r_busy & r_took):
                m.d.comb += [
                    host.rvalid.eq(t.rvalid),
                    host.rdata.eq(t.rdata),
                    host.rresp.eq(t.rresp),
                    t.rready.eq(host.rready),
                ]
        with m.If(host.awvalid & host.awready):
            m.d.sync += [w_busy.eq(1), w_owner.eq(wsel)]
        with m.If(host.bvalid & host.bready):
            m.d.sync += w_busy.eq(0)
        with m.If(host.arvalid & host.arready):
            m.d.sync += [r_busy.eq(1), r_owner.eq(rsel)]
        with m.If(host.rvalid & host.rready):
            m.d.sync += r_busy.eq(0)
        return m


class NpuSoc(wiring.Component):
    """`config.engines` engines (each an `NpuCore` of `config.engine`). `bus`: AXI4 master to DRAM;
    `ctrl`: AXI4-Lite slave (SoC block + engine windows); `irq`: combined interrupt; `irqs`: one per
    engine."""

    def __init__(self, config: NpuConfig | str = "duo"):
        self.cfg = get_config(config)
        n = self.cfg.engines
        super().__init__(
            {
                "bus": Out(soc_dram_signature(self.cfg)),
                "ctrl": In(soc_regs_signature()),
                "irq": Out(1),
                "irqs": Out(n),
            }
        )

    def elaborate(self, platform):
        m = Module()
        cfg, n = self.cfg, self.cfg.engines
        cores = []
        for i in range(n):
            core = engine_core(cfg.engine)
            m.submodules[f"engine{i}"] = core
            cores.append(core)
        m.submodules.xbar = xbar = AxiInterconnect(n, dram_signature(cfg))
        for i, core in enumerate(cores):
            wiring.connect(m, core.bus, xbar.masters[i])
        wiring.connect(m, xbar.bus, wiring.flipped(self.bus))

        m.submodules.decoder = dec = RegisterDecoder(n + 1)
        wiring.connect(m, wiring.flipped(self.ctrl), dec.host)
        m.submodules.soc_regs = soc_regs = SocRegisters(cfg)
        wiring.connect(m, dec.targets[0], soc_regs.bus)
        for i, core in enumerate(cores):
            wiring.connect(m, dec.targets[i + 1], core.ctrl)
        m.d.comb += [
            self.irqs.eq(Cat(*[c.irq for c in cores])),
            soc_regs.lines.eq(self.irqs),
            self.irq.eq(soc_regs.irq),
        ]
        return m

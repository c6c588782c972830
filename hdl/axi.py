"""Bus signatures: AXI4 (the core's DRAM master) and AXI4-Lite (its register slave), in the manner of
amaranth-soc's `wishbone.Signature`: members are named by the AXI signal without its prefix and point
the master's way (a slave takes the flipped signature). `FlatPorts` turns interfaces into the flat
`m_axi_*` / `s_axil_*` ports a Verilog top (and cocotbext-axi's `from_prefix`) expects.
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


class AxiSignature(wiring.Signature):
    """AXI4 master: AR/R/AW/W/B channels with INCR bursts (AxLEN, AxSIZE, AxBURST), ids and
    responses (the core drives ids 0 and ignores responses)."""

    def __init__(self, *, data_width: int, addr_width: int = 32, id_width: int = 4):
        self.data_width, self.addr_width, self.id_width = data_width, addr_width, id_width
        members = {}
        for ch in ("ar", "aw"):
            members.update(
                {
                    f"{ch}id": Out(id_width),
                    f"{ch}addr": Out(addr_width),
                    f"{ch}len": Out(8),
                    f"{ch}size": Out(3),
                    f"{ch}burst": Out(2),
                    f"{ch}valid": Out(1),
                    f"{ch}ready": In(1),
                }
            )
        members.update(
            {
                "rid": In(id_width),
                "rdata": In(data_width),
                "rresp": In(2),
                "rlast": In(1),
                "rvalid": In(1),
                "rready": Out(1),
                "wdata": Out(data_width),
                "wstrb": Out(data_width // 8),
                "wlast": Out(1),
                "wvalid": Out(1),
                "wready": In(1),
                "bid": In(id_width),
                "bresp": In(2),
                "bvalid": In(1),
                "bready": Out(1),
            }
        )
        super().__init__(members)

    def __eq__(self, other):
        return isinstance(other, AxiSignature) and (
            (self.data_width, self.addr_width, self.id_width)
            == (other.data_width, other.addr_width, other.id_width)
        )

    def __repr__(self):
        w = (self.data_width, self.addr_width, self.id_width)
        return "AxiSignature(data_width={}, addr_width={}, id_width={})".format(*w)


class AxiLiteSignature(wiring.Signature):
    """AXI4-Lite master: 32-bit data, one beat per transaction."""

    def __init__(self, *, addr_width: int):
        self.addr_width = addr_width
        super().__init__(
            {
                "awaddr": Out(addr_width),
                "awvalid": Out(1),
                "awready": In(1),
                "wdata": Out(32),
                "wstrb": Out(4),
                "wvalid": Out(1),
                "wready": In(1),
                "bresp": In(2),
                "bvalid": In(1),
                "bready": Out(1),
                "araddr": Out(addr_width),
                "arvalid": Out(1),
                "arready": In(1),
                "rdata": In(32),
                "rresp": In(2),
                "rvalid": In(1),
                "rready": Out(1),
            }
        )

    def __eq__(self, other):
        return isinstance(other, AxiLiteSignature) and self.addr_width == other.addr_width

    def __repr__(self):
        return f"AxiLiteSignature(addr_width={self.addr_width})"


class FlatPorts(wiring.Component):
    """A Verilog top around `inner`: every member of `inner` becomes a port, an interface member's
    signals flattened to `<prefix>_<name>` (prefixes per member, e.g. {"bus": "m_axi"})."""

    def __init__(self, inner: wiring.Component, prefixes: dict[str, str]):
        self.inner, self.prefixes = inner, prefixes
        ports = {}
        for name, member in inner.signature.members.items():
            if member.is_signature:
                # an In member's signature is already flipped: flows are the component's own
                for sub, sm in member.signature.members.items():
                    ports[f"{prefixes[name]}_{sub}"] = sm.flow(sm.shape)
            else:
                ports[name] = member
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = inner = self.inner
        for name, member in inner.signature.members.items():
            if member.is_signature:
                iface = getattr(inner, name)
                for sub, sm in member.signature.members.items():
                    port, sig = getattr(self, f"{self.prefixes[name]}_{sub}"), getattr(iface, sub)
                    m.d.comb += port.eq(sig) if sm.flow == Out else sig.eq(port)
            else:
                port, sig = getattr(self, name), getattr(inner, name)
                m.d.comb += port.eq(sig) if member.flow == Out else sig.eq(port)
        return m


def address_and_data(m: Module, bus, aw_done, w_done):
    """One AXI write's address and data handshakes, in either order: offers AW and W until each is
    taken (`aw_done`, `w_done` remember which already were); true in the cycle both are done."""
    m.d.comb += [bus.awvalid.eq(~aw_done), bus.wvalid.eq(~w_done)]
    aw = aw_done | bus.awready
    w = w_done | bus.wready
    m.d.sync += [aw_done.eq(aw), w_done.eq(w)]
    return aw & w


#: AXI4 channels: whether the master drives the channel, and its payload members
AXI_CHANNELS = {
    "ar": (True, ("arid", "araddr", "arlen", "arsize", "arburst")),
    "aw": (True, ("awid", "awaddr", "awlen", "awsize", "awburst")),
    "w": (True, ("wdata", "wstrb", "wlast")),
    "r": (False, ("rid", "rdata", "rresp", "rlast")),
    "b": (False, ("bid", "bresp")),
}


def skid_buffer(m: Module, valid, ready, data, out_valid, out_ready, out_data, name: str) -> None:
    """A full register stage on one valid/ready channel: every output (`ready` upstream, `out_valid`
    and `out_data` downstream) is a flip-flop, at one transfer per cycle. A beat the downstream
    refuses waits in a second register (the skid) while upstream sees `ready` fall."""
    o_valid = Signal(name=f"{name}_valid")
    o_data = Signal(len(data), name=f"{name}_data")
    k_valid = Signal(name=f"{name}_skid_valid")
    k_data = Signal(len(data), name=f"{name}_skid_data")
    m.d.comb += [ready.eq(~k_valid), out_valid.eq(o_valid), out_data.eq(o_data)]
    with m.If(out_ready | ~o_valid):  # the output register is free this cycle
        with m.If(k_valid):
            m.d.sync += [o_valid.eq(1), o_data.eq(k_data), k_valid.eq(0)]
        with m.Else():
            m.d.sync += [o_valid.eq(valid), o_data.eq(data)]
    with m.Elif(valid & ~k_valid):
        m.d.sync += [k_valid.eq(1), k_data.eq(data)]


class AxiRegisterSlice(wiring.Component):
    """An AXI4 register slice: `s` (to the master) and `m` (to the slave) with a skid buffer on
    each of the five channels, so no combinational path crosses it (Fmax: it cuts a master's
    handshakes off from an interconnect's arbitration and the slave's). One cycle more each way,
    one beat per cycle per channel."""

    def __init__(self, signature: AxiSignature):
        super().__init__({"s": In(signature), "m": Out(signature)})

    def elaborate(self, platform):
        m = Module()
        for ch, (forward, payload) in AXI_CHANNELS.items():
            up, down = (self.s, self.m) if forward else (self.m, self.s)
            skid_buffer(
                m,
                getattr(up, f"{ch}valid"),
                getattr(up, f"{ch}ready"),
                Cat(*[getattr(up, p) for p in payload]),
                getattr(down, f"{ch}valid"),
                getattr(down, f"{ch}ready"),
                Cat(*[getattr(down, p) for p in payload]),
                name=ch,
            )
        return m

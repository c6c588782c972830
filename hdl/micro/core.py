"""`MicroCore(config)`: the NPU engine for parts too small for `NpuCore` (the iCE40 UP5K).

The same ports and register map as `NpuCore` (AXI4 master to DRAM, AXI4-Lite register slave,
interrupt), the same ISA, but sequential: a PicoRV32 control processor runs the ISA from firmware
(`hdl/micro/firmware/`): it fetches, checks and dispatches each instruction into the four unit
queues, runs the queue heads whose tokens have arrived one at a time, and keeps the registers. Around
it the hardware is what the firmware cannot do fast or safely:

- the register window: a block RAM the host reads and writes directly (firmware writes STATUS, the
  counters, ...); CONTROL, IRQ and TIMEOUT are flip-flops with their side effects, CYCLES is a
  hardware counter, reading a counter's LO latches its HI; SOFT_RESET restarts the processor and
  clears the window (the host's accesses wait meanwhile);
- the DRAM window: each processor access becomes one AXI4 beat; error responses are recorded;
- the on-chip memory: two SPRAMs (64 KiB) hold the scratchpad, the accumulators and the firmware
  (code, data and stack), which the boot loader in block RAM copies there from the SPI flash at
  power-up (`flash`: its pins, bit-banged through MMIO_SPI). With simulation models of the SPRAMs
  the firmware is there from the start (`preload`), as the boot loader leaves it.

The memory map is `hdl/micro/memmap.py`.
"""

from __future__ import annotations

from pathlib import Path

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig, get_config
from npu.registers import ISA_VERSION, NPU_MAGIC, REG, REGISTERS, Status

from ..axi import AxiLiteSignature, AxiSignature, address_and_data
from ..mem.spram import SpramModel, SpramPrimitive
from ..regs import ADDR_BITS
from . import memmap as mm
from .cpu import PicoRV32
from .firmware import BOOT_IMAGE, IMAGE
from .mac import COLUMNS, MacArray

#: host-writable registers kept in the window's RAM (CONTROL, IRQ are flip-flops; TIMEOUT is both)
RAM_WRITABLE = tuple(r.offset for r in REGISTERS if r.access == "rw" and r.name != "CONTROL")
WIDE_LO = tuple(r.offset for r in REGISTERS if r.wide)
REG_WORDS = 64
#: SB_SPRAM256KA blocks the core uses (two side by side: 32-bit words)
SPRAMS = 2


def image_words(path: Path = IMAGE) -> list[int]:
    """The 32-bit words of a firmware image (`firmware.bin`, `boot.bin`)."""
    if not path.exists():
        raise RuntimeError(f"{path} is missing: build it with `python -m npu.hdl.micro.firmware`")
    blob = path.read_bytes()
    blob += bytes(-len(blob) % 4)
    return [int.from_bytes(blob[i : i + 4], "little") for i in range(0, len(blob), 4)]


def flash_signature() -> wiring.Signature:
    """The SPI flash's pins, as the core drives them (mode 0, one data line each way)."""
    return wiring.Signature({"cs_n": Out(1), "sck": Out(1), "copi": Out(1), "cipo": In(1)})


def check_config(cfg: NpuConfig) -> None:
    if cfg.bus_bytes != 4:
        raise ValueError(
            f"config {cfg.name}: the micro core has a 32-bit DRAM bus (bus_bytes=4), not {cfg.bus_bytes}"
        )
    if cfg.queue_depth > mm.QUEUE_LIMIT:
        raise ValueError(
            f"config {cfg.name}: the micro core's firmware holds unit queues of up to {mm.QUEUE_LIMIT} "
            f"instructions, not queue_depth={cfg.queue_depth}"
        )
    if cfg.spad_bytes + cfg.acc_bytes + mm.RAM_BYTES > 4 * mm.ONCHIP_WORDS:
        raise ValueError(
            f"config {cfg.name}: scratchpad ({cfg.spad_bytes}) + accumulators ({cfg.acc_bytes}) + "
            f"firmware data ({mm.RAM_BYTES}) exceed the micro core's {4 * mm.ONCHIP_WORDS} bytes of SPRAM"
        )


class MicroCore(wiring.Component):
    """One sequential engine (see the module docstring). `spram`: the SB_SPRAM256KA primitives
    (default: when elaborated for a platform) or their simulation models."""

    def __init__(self, config: NpuConfig | str = "icebreaker", *, spram: bool | None = None,
                 preload: bool | None = None):  # fmt: skip
        """`preload` (with simulation models of the SPRAMs only; default: with them): the firmware
        is in RAM, checked, from the start; else the boot loader reads it from `flash`."""
        self.cfg = get_config(config)
        check_config(self.cfg)
        self.spram = spram
        self.preload = preload
        super().__init__(
            {
                "bus": Out(AxiSignature(data_width=32)),
                "ctrl": In(AxiLiteSignature(addr_width=ADDR_BITS)),
                "irq": Out(1),
                "flash": Out(flash_signature()),
            }
        )

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        rom_words = image_words(BOOT_IMAGE)
        use_model = self.spram is False or (self.spram is None and platform is None)
        preload = use_model if self.preload is None else self.preload
        if preload and not use_model:
            raise ValueError("the firmware can be preloaded into simulation models of the SPRAMs only")
        m.submodules.cpu = cpu = PicoRV32(stack_top=mm.RAM_BASE + mm.RAM_BYTES)
        mem = cpu.mem
        top = mem.addr[28:32]
        is_rom = mem.valid & (top == 0) & ~mem.addr[16]
        is_ram = mem.valid & (top == 0) & mem.addr[16]
        is_onchip = mem.valid & (top == 1)
        is_dram = mem.valid & (top == 2)
        is_regs = mem.valid & (top == 3) & ~mem.addr[8]
        is_mmio = mem.valid & (top == 3) & mem.addr[8]

        soft_write = Signal()  # a cycle: the host wrote CONTROL.SOFT_RESET
        # the soft reset takes effect the cycle after that write, from a register: the write's path
        # through the processor's look-ahead address to the SPRAMs' address was the board's slowest.
        # The processor runs one cycle more; every register the reset clears is cleared after
        # (below) what the processor did in it, a DRAM access it started goes unanswered and a MAC
        # run it started stops
        soft_reset = Signal()
        m.d.sync += soft_reset.eq(soft_write)
        stop = Signal(2)  # the processor is held in reset for two cycles after it
        m.d.sync += stop.eq(Mux(soft_reset, 3, stop >> 1))
        m.d.comb += cpu.stop.eq(stop[0] | soft_reset)

        # -- firmware ROM and the on-chip SPRAM: a read starts on the processor's look-ahead
        # address, a cycle before it asks, so both answer at once (a read it asks for unannounced
        # starts then and answers a cycle later); a write takes its cycle
        la = mem.la_addr
        la_local = mem.la_read & (la[28:32] <= 1)
        la_rom = (la[28:32] == 0) & ~la[16]
        is_spram = is_ram | is_onchip
        primed = Signal()  # the read asked for now was started last cycle
        primed_rom = Signal()
        late = (is_rom | (is_spram & ~mem.wstrb.any())) & ~primed  # a read without look-ahead
        m.d.sync += [primed.eq(la_local | late), primed_rom.eq(Mux(la_local, la_rom, is_rom))]
        addr = Mux(mem.la_read, la, mem.addr)
        m.submodules.rom = rom = Memory(shape=32, depth=mm.BOOT_BYTES // 4, init=rom_words)
        rom_rd = rom.read_port()
        m.d.comb += [rom_rd.addr.eq(addr[2:]), rom_rd.en.eq(la_local | late)]
        ram_word = mm.ONCHIP_WORDS - mm.RAM_BYTES // 4  # the firmware's first word in the SPRAMs
        init = [0] * ram_word + image_words() if preload else []
        halves = [[w >> 16 * i & 0xFFFF for w in init] for i in range(SPRAMS)]
        blocks = [SpramModel(halves[i]) if use_model else SpramPrimitive() for i in range(SPRAMS)]
        for i, b in enumerate(blocks):
            m.submodules[f"spram{i}"] = b
        spad_words = cfg.spad_bytes // 4
        word = Signal(14)
        with m.If(addr[28:32] == 0):  # the firmware
            m.d.comb += word.eq(ram_word + addr[2:15])
        with m.Elif(addr[19]):  # ACC_BASE: the accumulators follow the scratchpad
            m.d.comb += word.eq(spad_words + addr[2:19])
        with m.Else():
            m.d.comb += word.eq(addr[2:19])
        spram_write = is_spram & mem.wstrb.any()
        spram_read = (mem.la_read & (la[28:32] <= 1) & ~la_rom) | (late & is_spram)
        # the MAC array reads the SPRAMs while the processor waits on its MMIO_MAC_STAGE / RUN write
        m.submodules.mac = mac = MacArray(model=use_model)
        for i, b in enumerate(blocks):
            s = mem.wstrb[2 * i : 2 * i + 2]
            m.d.comb += [
                b.port.addr.eq(Mux(mac.read, mac.addr, word)),
                b.port.wdata.eq(mem.wdata[16 * i : 16 * i + 16]),
                b.port.mask.eq(Cat(s[0], s[0], s[1], s[1])),
                # (a look-ahead read never meets a write: it comes with no access, or with the end of
                # an instruction fetch, and mem_ready must not depend on it: that would be a loop)
                b.port.wren.eq(spram_write),
                b.port.cs.eq(spram_read | spram_write | mac.read),
            ]
        spram_data = Cat(blocks[0].port.rdata, blocks[1].port.rdata)
        m.d.comb += mac.rdata.eq(spram_data)

        # -- MMIO: events, actions, cycle counter, configuration --------------------------------
        start_ev = Signal()
        pause = Signal()
        irq_pending = Signal()
        irq_enable = Signal()
        bus_fault = Signal()
        timeout = Signal(32)
        cycles = Signal(64)
        counting = Signal()
        timeout_hit = Signal()
        cyc_hi_latch = Signal(32)
        m.d.sync += timeout_hit.eq(
            counting & (timeout != 0) & ((cycles[32:] != 0) | (cycles[:32] >= timeout))
        )
        with m.If(counting):
            m.d.sync += cycles.eq(cycles + 1)
        m.d.comb += self.irq.eq(irq_pending & irq_enable)

        moff = mem.addr[2:8]
        mmio_data = Signal(32)
        # the flash's pins: CS_N, SCK, COPI as the boot loader last wrote them; CIPO through a
        # register (a pin; the loader reads it cycles after the edge it set)
        spi = Signal(3, init=1)
        cipo = Signal()
        booted = Signal(init=int(preload))  # MMIO_BOOT: not cleared by SOFT_RESET
        m.d.sync += cipo.eq(self.flash.cipo)
        m.d.comb += [self.flash.cs_n.eq(spi[0]), self.flash.sck.eq(spi[1]), self.flash.copi.eq(spi[2])]
        config = {
            "spad_bytes": cfg.spad_bytes, "acc_bytes": cfg.acc_bytes, "dram_bytes": cfg.dram_bytes,
            "lanes": cfg.lanes, "acc_row_bytes": cfg.acc_row_bytes, "queue_depth": cfg.queue_depth,
            "token_depth": cfg.token_depth, "config_id": cfg.config_id, "bus_bytes": cfg.bus_bytes,
        }  # fmt: skip
        with m.Switch(moff):
            with m.Case(mm.MMIO_EVENTS // 4):
                m.d.comb += mmio_data.eq(Cat(start_ev, pause, timeout_hit, bus_fault))
            with m.Case(mm.MMIO_CYCLES_LO // 4):
                m.d.comb += mmio_data.eq(cycles[:32])
            with m.Case(mm.MMIO_CYCLES_HI // 4):
                m.d.comb += mmio_data.eq(cyc_hi_latch)
            with m.Case(mm.MMIO_SPI // 4):
                m.d.comb += mmio_data.eq(cipo)
            with m.Case(mm.MMIO_BOOT // 4):
                m.d.comb += mmio_data.eq(booted)
            for c in range(COLUMNS):
                with m.Case(mm.MMIO_MAC_SUM0 // 4 + c):
                    m.d.comb += mmio_data.eq(mac.sums[c])
            for k, name in enumerate(mm.CONFIG_WORDS):
                with m.Case(mm.MMIO_CONFIG // 4 + k):
                    m.d.comb += mmio_data.eq(config[name] & 0xFFFFFFFF)
        # an MMIO access is answered from registers the cycle after it is asked (`mmio_ack`): its
        # decode and the MAC array's wait were the slowest path into the processor's memory
        # handshake; its effects (writes, latches) take the first cycle only
        mmio_ack = Signal()
        mmio_rdata = Signal(32)
        mmio_new = is_mmio & ~mmio_ack
        mmio_write = mmio_new & mem.wstrb.any()
        with m.If(mmio_write & (moff == mm.MMIO_SPI // 4)):
            m.d.sync += spi.eq(mem.wdata[:3])
        with m.If(mmio_write & (moff == mm.MMIO_BOOT // 4) & mem.wdata[0]):
            m.d.sync += booted.eq(1)
        # MMIO_MAC_STAGE and MMIO_MAC_RUN start the MAC array, and complete once it is done
        mac_stage = mmio_write & (moff == mm.MMIO_MAC_STAGE // 4)
        mac_run = mmio_write & (moff == mm.MMIO_MAC_RUN // 4)
        mac_started = Signal()
        mac_waiting = (mac_stage | mac_run) & ~(mac_started & ~mac.busy)
        n, sel = mm.MAC_COUNT_SHIFT, mm.MAC_SEL_SHIFT
        m.d.comb += [
            mac.stage.eq(mac_stage & ~mac_started), mac.run.eq(mac_run & ~mac_started),
            mac.word.eq(mem.wdata[:14]), mac.count.eq(mem.wdata[n : n + 9]),
            mac.col.eq(mem.wdata[sel : sel + 2]), mac.mode.eq(mem.wdata[sel : sel + 2]),
            mac.i16.eq((mem.wdata & mm.MAC_STAGE_I16) != 0), mac.stop.eq(soft_reset),
            mac.tail.eq(mem.wdata[mm.MAC_TAIL_SHIFT : mm.MAC_TAIL_SHIFT + 2]),
        ]  # fmt: skip
        m.d.sync += [
            mac_started.eq(mac_waiting & ~soft_reset),
            mmio_ack.eq(mmio_new & ~mac_waiting & ~soft_reset),
            mmio_rdata.eq(mmio_data),
        ]
        wait_tail = Signal(16)  # written by the firmware before it writes STATUS = WAITING
        with m.If(mmio_write & (moff == mm.MMIO_WAIT_TAIL // 4)):
            m.d.sync += wait_tail.eq(mem.wdata[:16])
        # the pause latch, for simulation benches: the progress the request met (the most points
        # a unit passed) and the target (that point, or with bit 30 the next)
        passed_max = Signal(30)
        pause_target = Signal(32)
        target_valid = Signal()
        with m.If(mmio_write & (moff == mm.MMIO_PAUSE_PROBE // 4)):
            m.d.sync += [
                passed_max.eq(mem.wdata[:30]),
                pause_target.eq(mem.wdata[:30] + mem.wdata[30]),
                target_valid.eq(mem.wdata[31]),
            ]
        with m.If(mmio_new & ~mem.wstrb.any() & (moff == mm.MMIO_CYCLES_LO // 4)):
            m.d.sync += cyc_hi_latch.eq(cycles[32:])
        with m.If(mmio_write & (moff == mm.MMIO_EVENTS // 4)):
            act = mem.wdata
            with m.If(act & mm.ACT_CLEAR_START):
                m.d.sync += start_ev.eq(0)
            with m.If(act & mm.ACT_CONSUME_PAUSE):
                m.d.sync += pause.eq(0)
            with m.If(act & mm.ACT_RAISE_IRQ):
                m.d.sync += irq_pending.eq(1)
            with m.If(act & mm.ACT_CLEAR_FAULT):
                m.d.sync += bus_fault.eq(0)
            with m.If(act & mm.ACT_COUNT):
                m.d.sync += [cycles.eq(0), counting.eq(1)]
            with m.If(act & mm.ACT_STOP_COUNT):
                m.d.sync += counting.eq(0)

        # -- DRAM window: one AXI4 beat per access --------------------------------------------
        bus = self.bus
        d_addr = Signal(32)
        d_wdata = Signal(32)
        d_wstrb = Signal(4)
        d_rdata = Signal(32)
        aw_done = Signal()
        w_done = Signal()
        stale = Signal()  # the processor was reset while this access was under way: do not answer
        dram_ready = Signal()
        m.d.comb += [
            bus.araddr.eq(d_addr), bus.arlen.eq(0), bus.arsize.eq(2), bus.arburst.eq(1), bus.arid.eq(0),
            bus.awaddr.eq(d_addr), bus.awlen.eq(0), bus.awsize.eq(2), bus.awburst.eq(1), bus.awid.eq(0),
            bus.wdata.eq(d_wdata), bus.wstrb.eq(d_wstrb), bus.wlast.eq(1),
        ]  # fmt: skip
        with m.FSM(name="dram"):
            with m.State("IDLE"):
                m.d.sync += stale.eq(0)
                with m.If(is_dram & ~stop.any()):
                    m.d.sync += [
                        d_addr.eq(Cat(Const(0, 2), mem.addr[2:28])),
                        d_wdata.eq(mem.wdata),
                        d_wstrb.eq(mem.wstrb),
                        aw_done.eq(0),
                        w_done.eq(0),
                    ]
                    with m.If(mem.wstrb.any()):
                        m.next = "WRITE"
                    with m.Else():
                        m.next = "READ"
            with m.State("READ"):
                m.d.comb += bus.arvalid.eq(1)
                with m.If(bus.arready):
                    m.next = "RDATA"
            with m.State("RDATA"):
                m.d.comb += bus.rready.eq(1)
                with m.If(bus.rvalid):
                    m.d.sync += d_rdata.eq(Mux(bus.rresp == 0, bus.rdata, 0))
                    with m.If(bus.rresp != 0):
                        m.d.sync += bus_fault.eq(1)
                    with m.If(bus.rlast):
                        m.next = "DONE"
            with m.State("WRITE"):
                with m.If(address_and_data(m, bus, aw_done, w_done)):
                    m.next = "BRESP"
            with m.State("BRESP"):
                m.d.comb += bus.bready.eq(1)
                with m.If(bus.bvalid):
                    with m.If(bus.bresp != 0):
                        m.d.sync += bus_fault.eq(1)
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += dram_ready.eq(~stale & ~stop.any())
                m.next = "IDLE"
        with m.If(soft_reset):
            m.d.sync += stale.eq(1)

        # -- the register window: the host's AXI4-Lite port and the processor share its RAM ------
        m.submodules.regs = regs = Memory(shape=32, depth=REG_WORDS, init=[])
        rp = regs.read_port()
        wp = regs.write_port()
        ctrl = self.ctrl
        r_valid = Signal()
        r_data = Signal(32)
        b_valid = Signal()
        h_word = Signal(6)  # the host's read: its word offset
        hi_latch = Signal(32)
        regs_ack = Signal()
        regs_rdata = Signal(32)
        clear_idx = Signal(7)
        # WAITING holds for the tail the firmware found the ring empty at (low bits: a ring has at
        # most dram_bytes / 32 slots, so the host cannot get 65536 instructions ahead)
        host_tail = Signal(16)
        m.d.comb += [ctrl.rvalid.eq(r_valid), ctrl.rdata.eq(r_data), ctrl.rresp.eq(0),
                     ctrl.bvalid.eq(b_valid), ctrl.bresp.eq(0)]  # fmt: skip
        with m.If(ctrl.rvalid & ctrl.rready):
            m.d.sync += r_valid.eq(0)
        with m.If(ctrl.bvalid & ctrl.bready):
            m.d.sync += b_valid.eq(0)
        m.d.sync += regs_ack.eq(0)

        def reset_value(idx):
            return Mux(idx == REG["ID"].offset // 4, NPU_MAGIC,
                   Mux(idx == REG["VERSION"].offset // 4, ISA_VERSION,
                   Mux(idx == REG["CONFIG_ID"].offset // 4, cfg.config_id,
                   Mux(idx == REG["STATUS"].offset // 4, int(Status.IDLE), 0))))  # fmt: skip

        cyc = REG["CYCLES"].offset // 4
        with m.FSM(name="regs"):
            with m.State("CLEAR"):  # after reset and SOFT_RESET: every word to its reset value
                m.d.comb += [wp.addr.eq(clear_idx), wp.data.eq(reset_value(clear_idx)), wp.en.eq(1)]
                m.d.sync += clear_idx.eq(clear_idx + 1)
                with m.If(clear_idx == REG_WORDS - 1):
                    m.next = "IDLE"
            with m.State("IDLE"):
                hw_off = ctrl.awaddr[2:8]
                with m.If(ctrl.awvalid & ctrl.wvalid & ~b_valid):
                    m.d.comb += [ctrl.awready.eq(1), ctrl.wready.eq(1)]
                    m.d.sync += b_valid.eq(1)
                    data = ctrl.wdata
                    with m.If(ctrl.awaddr[8:] != 0):
                        pass  # outside the window: ignored
                    with m.Elif(hw_off == REG["CONTROL"].offset // 4):
                        with m.If(data[2]):  # SOFT_RESET
                            m.d.comb += soft_write.eq(1)
                            m.d.sync += clear_idx.eq(0)
                            m.next = "CLEAR"
                        with m.Else():
                            m.d.sync += [irq_enable.eq(data[3]), pause.eq(data[1])]
                            with m.If(data[0]):
                                m.d.sync += start_ev.eq(1)
                    with m.Elif(hw_off == REG["IRQ"].offset // 4):
                        with m.If(data[0]):
                            m.d.sync += irq_pending.eq(0)
                    with m.Else():
                        with m.If(hw_off == REG["TIMEOUT"].offset // 4):
                            m.d.sync += timeout.eq(data)
                        with m.If(hw_off == REG["RING_TAIL"].offset // 4):
                            m.d.sync += host_tail.eq(data)
                        with m.If(Cat(*[hw_off == o // 4 for o in RAM_WRITABLE]).any()):
                            m.d.comb += [wp.addr.eq(hw_off), wp.data.eq(data), wp.en.eq(1)]
                with m.Elif(ctrl.arvalid & ~r_valid):
                    m.d.comb += [ctrl.arready.eq(1), rp.addr.eq(ctrl.araddr[2:8])]
                    m.d.sync += h_word.eq(Mux(ctrl.araddr[8:] != 0, REG_WORDS - 1, ctrl.araddr[2:8]))
                    m.next = "HOST_READ"
                with m.Elif(is_regs & ~regs_ack):
                    m.d.comb += rp.addr.eq(mem.addr[2:8])
                    with m.If(mem.wstrb.any()):
                        m.d.comb += [wp.addr.eq(mem.addr[2:8]), wp.data.eq(mem.wdata), wp.en.eq(1)]
                        m.d.sync += regs_ack.eq(1)
                    with m.Else():
                        m.next = "CPU_READ"
            with m.State("CPU_READ"):
                m.d.sync += [regs_rdata.eq(rp.data), regs_ack.eq(1)]
                m.next = "IDLE"
            with m.State("HOST_READ"):
                value = Signal(32)
                m.d.comb += [value.eq(rp.data), rp.addr.eq(h_word + 1)]
                is_lo = Cat(*[h_word == o // 4 for o in WIDE_LO]).any()
                is_hi = Cat(*[h_word == o // 4 + 1 for o in WIDE_LO]).any()
                with m.If(h_word == REG["CONTROL"].offset // 4):
                    m.d.comb += value.eq(Cat(Const(0, 1), pause, Const(0, 1), irq_enable))
                with m.Elif(h_word == REG["IRQ"].offset // 4):
                    m.d.comb += value.eq(irq_pending)
                with m.Elif((h_word == REG["STATUS"].offset // 4) & start_ev):
                    m.d.comb += value.eq(int(Status.RUNNING))  # a START the firmware has not taken yet
                stale_wait = (rp.data == int(Status.WAITING)) & (host_tail != wait_tail)
                with m.Elif((h_word == REG["STATUS"].offset // 4) & stale_wait):
                    # the host appended after the tail the firmware found empty: no longer waiting
                    m.d.comb += value.eq(int(Status.RUNNING))
                with m.Elif(h_word == cyc):
                    m.d.comb += value.eq(cycles[:32])
                    m.d.sync += hi_latch.eq(cycles[32:])
                with m.Elif(is_hi):
                    m.d.comb += value.eq(hi_latch)
                with m.Elif(h_word == REG_WORDS - 1):  # outside the window (and past the map)
                    m.d.comb += value.eq(0)
                m.d.sync += [r_data.eq(value), r_valid.eq(~(is_lo & (h_word != cyc)))]
                with m.If(is_lo & (h_word != cyc)):
                    m.next = "HOST_HI"
                with m.Else():
                    m.next = "IDLE"
            with m.State("HOST_HI"):
                m.d.sync += [hi_latch.eq(rp.data), r_valid.eq(1)]
                m.next = "IDLE"

        with m.If(soft_reset):  # last: over whatever the processor did in the cycle before it stopped
            m.d.sync += [
                start_ev.eq(0), pause.eq(0), irq_pending.eq(0), irq_enable.eq(0), bus_fault.eq(0),
                timeout.eq(0), counting.eq(0), cycles.eq(0), host_tail.eq(0),
            ]  # fmt: skip

        # -- the processor's read data and ready ------------------------------------------------
        with m.If((is_rom | (is_spram & ~mem.wstrb.any())) & primed):
            m.d.comb += [mem.ready.eq(1), mem.rdata.eq(Mux(primed_rom, rom_rd.data, spram_data))]
        with m.Elif(spram_write):
            m.d.comb += mem.ready.eq(1)
        with m.Elif(mmio_ack):
            m.d.comb += [mem.ready.eq(1), mem.rdata.eq(mmio_rdata)]
        with m.Elif(dram_ready):
            m.d.comb += [mem.ready.eq(1), mem.rdata.eq(d_rdata)]
        with m.Elif(regs_ack):
            m.d.comb += [mem.ready.eq(1), mem.rdata.eq(regs_rdata)]
        return m

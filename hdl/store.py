"""Store unit: 2-D strided DMA from the scratchpad or accumulators to DRAM.

A reader streams the rows' bytes (one on-chip word per cycle, registered reads) into a byte FIFO; an AW issuer
requests each row's DRAM words as AXI write bursts (split at 256 beats and 4 KiB); a W writer
realigns FIFO bytes to DRAM beats with strobes. The instruction finishes when every burst's write
response has arrived.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig
from npu.isa import INSTR_BITS, Opcode

from .common import (
    ByteFifo,
    burst_stream,
    exec_signature,
    is_acc,
    log2,
    low_bytes_mask,
    min_,
    view,
    word_index,
    write_beat_stream,
)


class StoreUnit(wiring.Component):
    def __init__(self, cfg: NpuConfig, spad_port, acc_port):
        """spad_port, acc_port: scratchpad and accumulator read clients of one bus word."""
        self.cfg = cfg
        self.spad_port = spad_port
        self.acc_port = acc_port
        super().__init__(
            {
                "exec": In(exec_signature()),
                "aw": Out(burst_stream()),
                "w": Out(write_beat_stream(cfg)),
                "b_valid": In(1),
                "b_ready": Out(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W = cfg.bus_bytes
        lw = log2(W)
        m.submodules.fifo = fifo = ByteFifo(W, cap_words=3)
        ins = Signal(INSTR_BITS)
        f = view(Opcode.STORE, ins)
        with m.If(self.exec.go):
            m.d.sync += ins.eq(self.exec.instr)
        active = Signal()
        m.d.comb += self.exec.busy.eq(active)
        empty = Signal()
        m.d.comb += empty.eq((f.rows == 0) | (f.cols == 0))

        # ---- reader: on-chip words -> FIFO ---------------------------------------------------------
        # A read issued in one cycle (registered memory read) is pushed the next; it is issued only
        # when the FIFO will have room for it then, and again while the scratchpad refuses it.
        r_row = Signal(17)
        r_left = Signal(17)
        r_addr = Signal(21)
        r_row_addr = Signal(40)
        from_acc = Signal()
        ro = Signal(lw)
        m.d.comb += ro.eq(r_addr[:lw])
        sp, ap = self.spad_port, self.acc_port
        m.d.comb += [
            sp.addr.eq(word_index(r_addr, cfg, "spad") << log2(W // cfg.lanes)),
            ap.addr.eq(word_index(r_addr, cfg, "acc")),
        ]
        rn = Signal(range(W + 1))
        m.d.comb += rn.eq(min_(W - ro, r_left))
        pend = Signal()  # a word read last cycle is pushed this cycle
        pend_off = Signal(lw)
        pend_n = Signal(range(W + 1))
        want = Signal()
        m.d.comb += want.eq(
            active & ~empty & (r_row < f.rows) & (fifo.count + Mux(pend, 2 * W, W) <= fifo.cap)
        )
        m.d.comb += [sp.en.eq(want & ~from_acc), ap.en.eq(want & from_acc)]
        reading = Signal()  # the read goes out this cycle (the memory may refuse it)
        m.d.comb += reading.eq(want & Mux(from_acc, ap.grant, sp.grant))
        m.d.sync += [pend.eq(reading), pend_off.eq(ro), pend_n.eq(rn)]
        rword = Signal(8 * W)
        m.d.comb += rword.eq(Mux(from_acc, ap.data, sp.data))
        m.d.comb += [
            fifo.push_valid.eq(pend),
            fifo.push_data.eq(rword >> (pend_off * 8)),
            fifo.push_n.eq(pend_n),
        ]
        with m.If(reading):
            with m.If(rn == r_left):
                m.d.sync += [
                    r_row.eq(r_row + 1),
                    r_row_addr.eq(r_row_addr + f.spad_stride),
                    r_addr.eq(r_row_addr + f.spad_stride),
                    r_left.eq(f.cols),
                ]
            with m.Else():
                m.d.sync += [r_addr.eq(r_addr + rn), r_left.eq(r_left - rn)]

        # ---- burst splitting, shared by AW issuer and W writer ----------------------------------------
        def burst_of(addr, left):
            beats_row = (addr[:lw] + left + W - 1) >> lw
            to_4k = (4096 >> lw) - addr[lw:12]
            b = Signal(9)
            m.d.comb += b.eq(min_(min_(beats_row, 256), to_4k))
            return b

        # ---- AW issuer ----------------------------------------------------------------------------
        aw_row = Signal(17)
        aw_addr = Signal(48)
        aw_left = Signal(17)
        aw_row_addr = Signal(48)
        aw_burst = burst_of(aw_addr, aw_left)
        aw_bytes = Signal(18)
        m.d.comb += aw_bytes.eq((aw_burst << lw) - aw_addr[:lw])
        m.d.comb += [
            self.aw.payload.addr.eq(aw_addr[lw:32] << lw),
            self.aw.payload.len.eq(aw_burst - 1),
            self.aw.valid.eq(active & ~empty & (aw_row < f.rows)),
        ]
        aw_sent = Signal(24)  # bursts whose address was accepted
        with m.If(self.aw.valid & self.aw.ready):
            m.d.sync += aw_sent.eq(aw_sent + 1)
            with m.If(aw_bytes >= aw_left):
                m.d.sync += [
                    aw_row.eq(aw_row + 1),
                    aw_row_addr.eq(aw_row_addr + f.dram_stride),
                    aw_addr.eq(aw_row_addr + f.dram_stride),
                    aw_left.eq(f.cols),
                ]
            with m.Else():
                m.d.sync += [aw_addr.eq(aw_addr + aw_bytes), aw_left.eq(aw_left - aw_bytes)]

        # ---- W writer -----------------------------------------------------------------------------
        w_row = Signal(17)
        w_addr = Signal(48)
        w_left = Signal(17)  # bytes of the row still to write
        w_row_addr = Signal(48)
        w_burst_left = Signal(9)  # beats left in the current burst (0: start a new one)
        w_bursts = Signal(24)  # bursts completed
        new_burst = burst_of(w_addr, w_left)
        beats_left = Signal(9)
        m.d.comb += beats_left.eq(Mux(w_burst_left == 0, new_burst, w_burst_left))
        wo = Signal(lw)
        m.d.comb += wo.eq(w_addr[:lw])
        wn = Signal(range(W + 1))
        m.d.comb += wn.eq(min_(W - wo, w_left))
        can_w = Signal()
        m.d.comb += can_w.eq(active & ~empty & (w_row < f.rows) & (fifo.count >= wn) & (w_bursts < aw_sent))
        m.d.comb += [
            self.w.valid.eq(can_w),
            self.w.payload.data.eq(fifo.data << (wo * 8)),
            self.w.payload.strb.eq(low_bytes_mask(wn, W) << wo),
            self.w.payload.last.eq(beats_left == 1),
        ]
        with m.If(can_w & self.w.ready):
            m.d.comb += fifo.pop_n.eq(wn)
            m.d.sync += w_burst_left.eq(beats_left - 1)
            with m.If(beats_left == 1):
                m.d.sync += w_bursts.eq(w_bursts + 1)
            with m.If(wn == w_left):
                m.d.sync += [
                    w_row.eq(w_row + 1),
                    w_row_addr.eq(w_row_addr + f.dram_stride),
                    w_addr.eq(w_row_addr + f.dram_stride),
                    w_left.eq(f.cols),
                ]
            with m.Else():
                m.d.sync += [w_addr.eq(w_addr + wn), w_left.eq(w_left - wn)]

        # ---- write responses and completion ----------------------------------------------------------
        b_count = Signal(24)
        m.d.comb += self.b_ready.eq(1)
        with m.If(self.b_valid):
            m.d.sync += b_count.eq(b_count + 1)
        finished = Signal()
        m.d.comb += finished.eq(active & (empty | ((w_row >= f.rows) & (b_count + self.b_valid == aw_sent))))
        m.d.comb += self.exec.done.eq(finished)
        with m.If(finished):
            m.d.sync += active.eq(0)
        with m.If(self.exec.go):
            nf = view(Opcode.STORE, self.exec.instr)
            m.d.sync += [
                active.eq(1),
                r_row.eq(0),
                r_left.eq(nf.cols),
                r_addr.eq(nf.spad),
                r_row_addr.eq(nf.spad),
                from_acc.eq(is_acc(nf.spad)),
                aw_row.eq(0),
                aw_addr.eq(nf.dram),
                aw_row_addr.eq(nf.dram),
                aw_left.eq(nf.cols),
                aw_sent.eq(0),
                w_row.eq(0),
                w_addr.eq(nf.dram),
                w_row_addr.eq(nf.dram),
                w_left.eq(nf.cols),
                w_burst_left.eq(0),
                w_bursts.eq(0),
                b_count.eq(0),
            ]
        return m

"""Load unit: 2-D strided DMA from DRAM into the scratchpad or accumulators, with padding.

Three processes run concurrently on one LOAD instruction:
  * the AR issuer requests each data row's DRAM words as AXI bursts (split at 256 beats and 4 KiB);
  * the generator produces the padded image byte stream row by row (pad bytes from pad_value, data
    bytes from the R beats, realigned) into a byte FIFO;
  * the writer drains the FIFO into on-chip words with byte enables, one word per cycle.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig
from npu.isa import INSTR_BITS, Opcode

from .common import (
    ByteFifo,
    beat_stream,
    burst_stream,
    exec_signature,
    is_acc,
    log2,
    low_bytes_mask,
    min_,
    view,
    word_index,
)


class LoadUnit(wiring.Component):
    def __init__(self, cfg: NpuConfig, spad_port, acc_port):
        """spad_port, acc_port: scratchpad and accumulator write clients of one bus word."""
        self.cfg = cfg
        self.spad_port = spad_port
        self.acc_port = acc_port
        super().__init__(
            {
                "exec": In(exec_signature()),
                # AXI read bursts and their beats (through the read arbiter)
                "ar": Out(burst_stream()),
                "r": In(beat_stream(cfg)),
            }
        )

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W = cfg.bus_bytes
        lw = log2(W)
        m.submodules.fifo = fifo = ByteFifo(W)

        ins = Signal(INSTR_BITS)
        f = view(Opcode.LOAD, ins)
        with m.If(self.exec.go):
            m.d.sync += ins.eq(self.exec.instr)

        tr = Signal(18)
        tw = Signal(18)
        m.d.comb += [
            tr.eq(f.pad_top + f.rows + f.pad_bottom),
            tw.eq(f.pad_left + f.cols + f.pad_right),
        ]
        active = Signal()
        m.d.comb += self.exec.busy.eq(active)

        # ---- AR issuer --------------------------------------------------------------------------
        ar_row = Signal(16)
        ar_addr = Signal(33)  # next byte address of the current row still to request
        ar_left = Signal(17)  # bytes of the current row still to request (from ar_addr)
        ar_active = Signal()
        row_addr = Signal(48)  # DRAM address of row ar_row
        beats_row = Signal(18)
        m.d.comb += beats_row.eq((ar_addr[:lw] + ar_left + W - 1) >> lw)
        to_4k = Signal(10)
        m.d.comb += to_4k.eq((4096 >> lw) - ar_addr[lw:12])
        burst = Signal(9)
        m.d.comb += burst.eq(min_(min_(beats_row, 256), to_4k))
        m.d.comb += [
            self.ar.payload.addr.eq(ar_addr[lw:32] << lw),
            self.ar.payload.len.eq(burst - 1),
            self.ar.valid.eq(ar_active & (ar_left != 0)),
        ]
        burst_bytes = Signal(18)
        m.d.comb += burst_bytes.eq((burst << lw) - ar_addr[:lw])
        with m.If(self.ar.valid & self.ar.ready):
            with m.If(burst_bytes >= ar_left):
                # row fully requested: next row
                m.d.sync += [
                    ar_row.eq(ar_row + 1),
                    row_addr.eq(row_addr + f.dram_stride),
                    ar_addr.eq(row_addr + f.dram_stride),
                    ar_left.eq(Mux(ar_row + 1 < f.rows, f.cols, 0)),
                ]
            with m.Else():
                m.d.sync += [ar_addr.eq(ar_addr + burst_bytes), ar_left.eq(ar_left - burst_bytes)]

        # ---- generator: padded byte stream into the FIFO ---------------------------------------------
        g_row = Signal(18)  # output row being generated
        g_col = Signal(18)  # byte position within the padded row
        g_active = Signal()
        g_dram = Signal(48)  # DRAM byte address of the next data byte (for the R beat offset)
        in_data_row = Signal()
        m.d.comb += in_data_row.eq((g_row >= f.pad_top) & (g_row < f.pad_top + f.rows))
        seg_data = Signal()
        seg_left = Signal(18)  # bytes left in the current segment
        with m.If(in_data_row & (g_col >= f.pad_left) & (g_col < f.pad_left + f.cols)):
            m.d.comb += [seg_data.eq(1), seg_left.eq(f.pad_left + f.cols - g_col)]
        with m.Elif(in_data_row & (g_col < f.pad_left)):
            m.d.comb += seg_left.eq(f.pad_left - g_col)
        with m.Else():
            m.d.comb += seg_left.eq(tw - g_col)
        off = Signal(lw)
        m.d.comb += off.eq(g_dram[:lw])
        n_data = Signal(range(W + 1))
        m.d.comb += n_data.eq(min_(W - off, seg_left))
        n_pad = Signal(range(W + 1))
        m.d.comb += n_pad.eq(min_(W, seg_left))
        pad_word = Signal(8 * W)
        m.d.comb += pad_word.eq(f.pad_value.as_unsigned().replicate(W))
        advance = Signal(range(W + 1))
        with m.If(g_active & (g_row < tr)):
            with m.If(seg_data):
                m.d.comb += [
                    self.r.ready.eq(fifo.push_ready),
                    fifo.push_valid.eq(self.r.valid),
                    fifo.push_data.eq(self.r.payload >> (off * 8)),
                    fifo.push_n.eq(n_data),
                ]
                with m.If(self.r.valid & fifo.push_ready):
                    m.d.comb += advance.eq(n_data)
                    m.d.sync += g_dram.eq(g_dram + n_data)
            with m.Else():
                m.d.comb += [
                    fifo.push_valid.eq(1),
                    fifo.push_data.eq(pad_word),
                    fifo.push_n.eq(n_pad),
                ]
                with m.If(fifo.push_ready):
                    m.d.comb += advance.eq(n_pad)
        with m.If(advance != 0):
            with m.If(g_col + advance >= tw):
                m.d.sync += [g_col.eq(0), g_row.eq(g_row + 1)]
                with m.If(in_data_row):
                    # next data row starts at the next row's DRAM address
                    m.d.sync += g_dram.eq(g_dram + advance * seg_data - f.cols + f.dram_stride)
            with m.Else():
                m.d.sync += g_col.eq(g_col + advance)

        # ---- writer: FIFO -> on-chip words ----------------------------------------------------------
        w_row = Signal(18)
        w_left = Signal(18)
        w_addr = Signal(21)
        w_row_addr = Signal(40)
        to_acc = Signal()
        w_active = Signal()
        wo = Signal(lw)
        m.d.comb += wo.eq(w_addr[:lw])
        need = Signal(range(W + 1))
        m.d.comb += need.eq(min_(W - wo, w_left))
        ready = Signal()  # a word is ready to write
        m.d.comb += ready.eq(w_active & (w_row < tr) & (need != 0) & (fifo.count >= need))
        sp, ap = self.spad_port, self.acc_port
        write = Signal()  # it is written this cycle (the memory may refuse it)
        m.d.comb += write.eq(ready & Mux(to_acc, ap.grant, sp.grant))
        be = Signal(W)
        m.d.comb += be.eq(low_bytes_mask(need, W) << wo)
        wdata = Signal(8 * W)
        m.d.comb += wdata.eq(fifo.data << (wo * 8))
        m.d.comb += [
            sp.addr.eq(word_index(w_addr, cfg, "spad") << log2(W // cfg.lanes)),
            sp.data.eq(wdata),
            sp.be.eq(be),
            sp.en.eq(ready & ~to_acc),
            ap.addr.eq(word_index(w_addr, cfg, "acc")),
            ap.data.eq(wdata),
            ap.be.eq(be),
            ap.en.eq(ready & to_acc),
        ]
        with m.If(write):
            m.d.comb += fifo.pop_n.eq(need)
            with m.If(need == w_left):
                m.d.sync += [
                    w_row.eq(w_row + 1),
                    w_row_addr.eq(w_row_addr + f.spad_stride),
                    w_addr.eq(w_row_addr + f.spad_stride),
                    w_left.eq(tw),
                ]
            with m.Else():
                m.d.sync += [w_addr.eq(w_addr + need), w_left.eq(w_left - need)]

        # ---- control ------------------------------------------------------------------------------
        finished = Signal()
        m.d.comb += finished.eq(active & ((w_row >= tr) | (tw == 0)))
        m.d.comb += self.exec.done.eq(finished)
        with m.If(finished):
            m.d.sync += [active.eq(0), ar_active.eq(0), g_active.eq(0), w_active.eq(0)]
        with m.If(self.exec.go):
            nf = view(Opcode.LOAD, self.exec.instr)
            m.d.sync += [
                active.eq(1),
                ar_active.eq(1),
                g_active.eq(1),
                w_active.eq(1),
                ar_row.eq(0),
                row_addr.eq(nf.dram),
                ar_addr.eq(nf.dram),
                ar_left.eq(Mux(nf.rows != 0, nf.cols, 0)),
                g_row.eq(0),
                g_col.eq(0),
                g_dram.eq(nf.dram),
                w_row.eq(0),
                w_left.eq(nf.pad_left + nf.cols + nf.pad_right),
                w_addr.eq(nf.spad),
                w_row_addr.eq(nf.spad),
                to_acc.eq(is_acc(nf.spad)),
            ]
        return m

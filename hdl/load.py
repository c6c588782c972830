"""Load unit: 2-D strided DMA from DRAM into the scratchpad or accumulators, with padding.

Three processes run concurrently on one LOAD instruction:
  * the AR issuer requests each data row's DRAM words as AXI bursts (split at 256 beats and 4 KiB);
  * the generator produces the padded image byte stream row by row (pad bytes from pad_value, or
    int16 elements pad_value * 256 with `pad_i16`; data bytes from the R beats, realigned) into a
    byte FIFO;
  * the writer drains the FIFO into on-chip words with byte enables, one word per cycle.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig
from npu.isa import INSTR_BITS, Opcode

from .common import (
    ByteFifo,
    beat_stream,
    burst_plan,
    burst_stream,
    exec_signature,
    is_acc,
    log2,
    low_bytes_mask,
    min_,
    view,
    word_index,
)

# the generator's row phases, and the segments of a data row
TOP, DATA, BOTTOM, DONE = range(4)
PAD_L, SEG_DATA, PAD_R = range(3)


def _next_phase(after, fl):
    """The first phase after `after` that has rows (DONE if none)."""
    from_top = Mux(fl.rows != 0, DATA, Mux(fl.pad_bottom != 0, BOTTOM, DONE))
    return Mux(after == TOP, from_top, Mux((after == DATA) & (fl.pad_bottom != 0), BOTTOM, DONE))


def _phase_rows(phase, fl):
    """The rows of `phase` (instruction fields `fl`)."""
    return Mux(phase == TOP, fl.pad_top, Mux(phase == DATA, fl.rows, fl.pad_bottom))


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
        m.submodules.fifo = fifo = ByteFifo(self.cfg.bus_bytes)

        ins = Signal(INSTR_BITS)
        f = view(Opcode.LOAD, ins)
        with m.If(self.exec.go):
            m.d.sync += ins.eq(self.exec.instr)

        tr = Signal(18)  # padded rows and row bytes, registered at go
        tw = Signal(18)
        active = Signal()
        m.d.comb += self.exec.busy.eq(active)

        ar = self._ar_issuer(m, f)
        gen = self._generator(m, f, fifo, tw)
        wr = self._writer(m, f, fifo, tr, tw)
        self._control(m, active, tr, tw, ar, gen, wr)
        return m

    def _ar_issuer(self, m: Module, f) -> SimpleNamespace:
        """The AR issuer: each data row's DRAM words requested as AXI bursts."""
        W = self.cfg.bus_bytes
        lw = log2(W)
        # The burst at the current address (`cur`) and the first burst of the next row are worked
        # out from registers a cycle ahead, so no burst arithmetic feeds the handshake (Fmax). A new
        # row's burst is ready at once (one-burst rows go out one per cycle); a row split into
        # several bursts (256 beats, 4 KiB) waits a cycle for each further burst's length.
        # `cur_bytes` is meaningful only for a burst that does not end the row (burst_plan).
        ar_row = Signal(16)
        ar_addr = Signal(33)  # next byte address of the current row still to request
        ar_left = Signal(17)  # bytes of the current row still to request (from ar_addr)
        ar_active = Signal()
        ar_more = Signal()  # rows are left to request
        nrow_addr = Signal(33)  # DRAM address of the row after the current one
        cur_ok = Signal()  # cur_* hold the burst at ar_addr
        cur_beats, cur_bytes, cur_end = Signal(9), Signal(18), Signal()
        here = burst_plan(m, ar_addr, ar_left, W, "ar_here")
        nrow = burst_plan(m, nrow_addr, f.cols, W, "ar_nrow")
        m.d.comb += [
            self.ar.payload.addr.eq(ar_addr[lw:32] << lw),
            self.ar.payload.len.eq(cur_beats - 1),
            self.ar.valid.eq(ar_active & ar_more & cur_ok & (f.cols != 0)),
        ]
        with m.If(~cur_ok):
            m.d.sync += [cur_ok.eq(1), cur_beats.eq(here[0]), cur_bytes.eq(here[1]), cur_end.eq(here[2])]
        with m.If(self.ar.valid & self.ar.ready):
            with m.If(cur_end):
                # row fully requested: next row
                m.d.sync += [
                    ar_row.eq(ar_row + 1),
                    ar_more.eq(ar_row + 1 < f.rows),
                    ar_addr.eq(nrow_addr),
                    ar_left.eq(f.cols),
                    nrow_addr.eq(nrow_addr + f.dram_stride),
                    cur_beats.eq(nrow[0]),
                    cur_bytes.eq(nrow[1]),
                    cur_end.eq(nrow[2]),
                ]
            with m.Else():
                m.d.sync += [ar_addr.eq(ar_addr + cur_bytes), ar_left.eq(ar_left - cur_bytes), cur_ok.eq(0)]
        return SimpleNamespace(
            active=ar_active,
            row=ar_row,
            more=ar_more,
            addr=ar_addr,
            left=ar_left,
            nrow_addr=nrow_addr,
            cur_ok=cur_ok,
            cur_beats=cur_beats,
            cur_bytes=cur_bytes,
            cur_end=cur_end,
        )

    def _generator(self, m: Module, f, fifo, tw) -> SimpleNamespace:
        """The generator: the padded byte stream (pad bytes and realigned R beats) into the FIFO."""
        W = self.cfg.bus_bytes
        lw = log2(W)
        # Each row is a run of segments (pad rows: one pad segment of tw bytes; data rows: pad_left,
        # cols of data, pad_right, empty ones skipped); each cycle moves at most one segment's bytes.
        # The row phase (top pad, data, bottom pad), the segment and the bytes left in it are
        # registers, so no adder or comparison of instruction fields sits before the FIFO (Fmax).
        g_active = Signal()
        g_phase = Signal(2)  # the current row's phase
        g_rows = Signal(16)  # rows of the phase left, the current one included
        g_seg = Signal(2)  # the segment within the row (a pad row is one PAD_R segment of tw bytes)
        seg_left = Signal(18)  # bytes left in the current segment
        seg_small = Signal()  # seg_left <= W, kept beside it: this cycle's byte count needs no wide compare
        g_dram = Signal(48)  # DRAM byte address of the next data byte (for the R beat offset)
        g_row_dram = Signal(48)  # DRAM address of the current data row
        seg_data = Signal()
        m.d.comb += seg_data.eq((g_phase == DATA) & (g_seg == SEG_DATA))

        def seg_len(value) -> list:
            """Assignments that set the bytes left in the segment to `value`."""
            return [seg_left.eq(value), seg_small.eq(value <= W)]

        def row_start(phase, fl, width) -> list:
            """Assignments that start a row of `phase` (fields `fl` and padded row bytes `width`: the
            running or a new instruction's)."""
            first_seg = Mux(fl.pad_left != 0, PAD_L, Mux(fl.cols != 0, SEG_DATA, PAD_R))
            first_len = Mux(fl.pad_left != 0, fl.pad_left, Mux(fl.cols != 0, fl.cols, fl.pad_right))
            return [
                g_seg.eq(Mux(phase == DATA, first_seg, PAD_R)),
                *seg_len(Mux(phase == DATA, first_len, width)),
            ]

        off = Signal(lw)
        m.d.comb += off.eq(g_dram[:lw])
        lim = Signal(range(W + 1))  # the most bytes this cycle: to the beat's end, or a bus word of pad
        m.d.comb += lim.eq(Mux(seg_data, W - off, W))
        last = Signal()  # the segment ends this cycle if it moves (seg_left <= lim, lim <= W)
        short = seg_left[: lw + 1]  # seg_left when seg_small
        m.d.comb += last.eq(seg_small & (short <= lim))
        n = Signal(range(W + 1))
        m.d.comb += n.eq(Mux(last, short, lim))
        # int16 padding (pad_i16): elements pad_value * 256, a zero byte at every even column of the
        # padded row. A pad segment starts at an even column except a data row's right padding after
        # an odd number of data bytes (pad_left is even), and moves whole bus words (W even), so its
        # words all start at the same column parity
        pv = f.pad_value.as_unsigned()
        odd = Signal()
        m.d.comb += odd.eq((g_phase == DATA) & (g_seg == PAD_R) & f.cols[0])
        pad_word = Signal(8 * W)
        m.d.comb += pad_word.eq(
            Mux(
                f.pad_i16,
                Mux(odd, Cat(pv, Const(0, 8)), Cat(Const(0, 8), pv)).replicate(W // 2),
                pv.replicate(W),
            )
        )
        moved = Signal()
        with m.If(g_active & (g_phase != DONE)):
            with m.If(seg_data):
                m.d.comb += [
                    self.r.ready.eq(fifo.push_ready),
                    fifo.push_valid.eq(self.r.valid),
                    fifo.push_data.eq(self.r.payload >> (off * 8)),
                    fifo.push_n.eq(n),
                    moved.eq(self.r.valid & fifo.push_ready),
                ]
                with m.If(self.r.valid & fifo.push_ready):
                    m.d.sync += g_dram.eq(g_dram + n)
            with m.Else():
                m.d.comb += [
                    fifo.push_valid.eq(1),
                    fifo.push_data.eq(pad_word),
                    fifo.push_n.eq(n),
                    moved.eq(fifo.push_ready),
                ]
        row_end = Signal()  # the row's last segment ends this cycle
        data_row = g_phase == DATA
        with m.If(moved):
            with m.If(~last):
                m.d.sync += seg_len(seg_left - n)
            with m.Elif(data_row & (g_seg == PAD_L) & (f.cols != 0)):
                m.d.sync += [g_seg.eq(SEG_DATA), *seg_len(f.cols)]
            with m.Elif(data_row & (g_seg != PAD_R) & (f.pad_right != 0)):
                m.d.sync += [g_seg.eq(PAD_R), *seg_len(f.pad_right)]
            with m.Else():
                m.d.comb += row_end.eq(1)
        with m.If(row_end):
            with m.If(data_row):  # the next data row starts at the next row's DRAM address
                next_row = g_row_dram + f.dram_stride
                m.d.sync += [g_dram.eq(next_row), g_row_dram.eq(next_row)]
            with m.If(g_rows > 1):
                m.d.sync += [g_rows.eq(g_rows - 1), *row_start(g_phase, f, tw)]
            with m.Else():
                nxt = Signal(2)
                m.d.comb += nxt.eq(_next_phase(g_phase, f))
                m.d.sync += [g_phase.eq(nxt), g_rows.eq(_phase_rows(nxt, f)), *row_start(nxt, f, tw)]
        return SimpleNamespace(
            active=g_active,
            phase=g_phase,
            rows=g_rows,
            dram=g_dram,
            row_dram=g_row_dram,
            row_start=row_start,
        )

    def _writer_plan(self, wo, need, row_end):
        """`plan(m, first, left, name)`: the assignments that set the writer's word registers for
        a word starting at byte `first` of a bus word with `left` bytes of the row to write."""
        W = self.cfg.bus_bytes
        lw = log2(W)

        def plan(m: Module, first, left, name: str) -> list:
            room = Signal(range(W + 1), name=f"{name}_room")
            small = Signal(name=f"{name}_small")
            n = Signal(range(W + 1), name=f"{name}_need")
            m.d.comb += [room.eq(W - first), small.eq(left <= W)]
            m.d.comb += n.eq(Mux(small, min_(room, left[: lw + 1]), room))
            return [wo.eq(first), need.eq(n), row_end.eq(small & (n == left[: lw + 1]))]

        return plan

    def _writer(self, m: Module, f, fifo, tr, tw) -> SimpleNamespace:
        """The writer: FIFO bytes into on-chip words with byte enables, one word per cycle."""
        cfg = self.cfg
        W = cfg.bus_bytes
        lw = log2(W)
        w_row = Signal(18)
        w_left = Signal(18)
        w_addr = Signal(21)
        w_row_addr = Signal(40)
        to_acc = Signal()
        w_active = Signal()
        # w_left <= W, kept beside it (as the reader's seg_small): this cycle's byte count and the
        # row's end need only short compares, not 18-bit ones on the path through the memory's
        # grant to the row registers (Fmax). The word's first byte `wo`, the bytes it takes
        # (`need`) and whether it ends the row are registers too, worked out from the values
        # w_addr and w_left are loaded with (`plan`), so the FIFO's count compare and the byte
        # enables start from flip-flops (same cycles)
        w_small = Signal()
        wo = Signal(lw)
        need = Signal(range(W + 1))
        row_end = Signal()  # this word ends the row (need == w_left)
        plan = self._writer_plan(wo, need, row_end)
        ready = Signal()  # a word is ready to write
        w_more = Signal()  # rows are left to write (registered)
        m.d.comb += ready.eq(w_active & w_more & (need != 0) & (fifo.count >= need))
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
        # the next word's plans, for the row's end and for a word within the row
        left = Signal(18)
        m.d.comb += left.eq(w_left - need)
        row_next = plan(m, (w_row_addr[:lw] + f.spad_stride[:lw])[:lw], tw, "w_row_next")
        word_next = plan(m, (wo + need)[:lw], left, "w_next")
        with m.If(write):
            m.d.comb += fifo.pop_n.eq(need)
            with m.If(row_end):
                m.d.sync += [
                    w_more.eq(w_row + 1 < tr),
                    w_row.eq(w_row + 1),
                    w_row_addr.eq(w_row_addr + f.spad_stride),
                    w_addr.eq(w_row_addr + f.spad_stride),
                    w_left.eq(tw),
                    w_small.eq(tw <= W),
                    *row_next,
                ]
            with m.Else():
                m.d.sync += [
                    w_addr.eq(w_addr + need),
                    w_left.eq(left),
                    w_small.eq(left <= W),
                    *word_next,
                ]
        return SimpleNamespace(
            active=w_active,
            more=w_more,
            row=w_row,
            left=w_left,
            small=w_small,
            addr=w_addr,
            row_addr=w_row_addr,
            to_acc=to_acc,
            plan=plan,
        )

    def _control(self, m: Module, active, tr, tw, ar, gen, wr) -> None:
        """Completion, and the start of all three processes when an instruction goes."""
        W = self.cfg.bus_bytes
        finished = Signal()
        m.d.comb += finished.eq(active & ~wr.more)
        m.d.comb += self.exec.done.eq(finished)
        with m.If(finished):
            m.d.sync += [active.eq(0), ar.active.eq(0), gen.active.eq(0), wr.active.eq(0)]
        nf = view(Opcode.LOAD, self.exec.instr)
        ntw = nf.pad_left + nf.cols + nf.pad_right
        first_word = wr.plan(m, nf.spad[: log2(W)], ntw, "w_first")
        with m.If(self.exec.go):
            ntr = nf.pad_top + nf.rows + nf.pad_bottom
            fb = burst_plan(m, nf.dram, nf.cols, W, "ar_first")
            first = Signal(2)
            m.d.comb += first.eq(Mux(nf.pad_top != 0, TOP, _next_phase(TOP, nf)))
            m.d.sync += [
                gen.phase.eq(Mux(ntw != 0, first, DONE)),
                gen.rows.eq(_phase_rows(first, nf)),
                *gen.row_start(first, nf, ntw),
            ]
            m.d.sync += [
                active.eq(1),
                ar.active.eq(1),
                gen.active.eq(1),
                wr.active.eq(1),
                ar.row.eq(0),
                ar.more.eq(nf.rows != 0),
                ar.addr.eq(nf.dram),
                ar.left.eq(nf.cols),
                ar.nrow_addr.eq(nf.dram + nf.dram_stride),
                ar.cur_ok.eq(1),
                ar.cur_beats.eq(fb[0]),
                ar.cur_bytes.eq(fb[1]),
                ar.cur_end.eq(fb[2]),
                gen.dram.eq(nf.dram),
                gen.row_dram.eq(nf.dram),
                tr.eq(ntr),
                tw.eq(ntw),
                wr.more.eq((ntr != 0) & (ntw != 0)),
                wr.row.eq(0),
                wr.left.eq(ntw),
                wr.small.eq(ntw <= W),
                wr.addr.eq(nf.spad),
                *first_word,
                wr.row_addr.eq(nf.spad),
                wr.to_acc.eq(is_acc(nf.spad)),
            ]

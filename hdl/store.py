"""Store unit: 2-D strided DMA from the scratchpad or accumulators to DRAM.

A reader streams the rows' bytes (one on-chip word per cycle, registered reads) into a byte FIFO; an AW issuer
requests each row's DRAM words as AXI write bursts (split at 256 beats and 4 KiB); a W writer
realigns FIFO bytes to DRAM beats with strobes. The instruction finishes when every burst's write
response has arrived.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig
from npu.isa import INSTR_BITS, Opcode

from .common import (
    ByteFifo,
    burst_plan,
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
        #: a write burst's address has been taken and its beats are not all sent: the memory (on a
        #: board, the one SDRAM every unit shares) waits on this unit's reads (registered)
        self.urgent = Signal()
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
        W = self.cfg.bus_bytes
        # four words: room for the two words in flight from the memory (read, then registered) and
        # the two the writer may be popping from (one beat per cycle)
        m.submodules.fifo = fifo = ByteFifo(W, cap_words=4, prerotated=True)
        ins = Signal(INSTR_BITS)
        f = view(Opcode.STORE, ins)
        with m.If(self.exec.go):
            m.d.sync += ins.eq(self.exec.instr)
        active = Signal()
        m.d.comb += self.exec.busy.eq(active)
        empty = Signal()
        m.d.comb += empty.eq((f.rows == 0) | (f.cols == 0))

        rd = self._reader(m, f, fifo, active, empty)
        aw = self._aw_issuer(m, f, active, empty)
        wr = self._w_writer(m, f, fifo, active, empty, aw.sent)
        m.d.sync += self.urgent.eq(active & (wr.bursts != aw.sent))
        self._completion(m, active, empty, rd, aw, wr)
        return m

    def _reader(self, m: Module, f, fifo, active, empty) -> SimpleNamespace:
        """The reader: on-chip words, read one per cycle, pushed into the FIFO."""
        cfg = self.cfg
        W = cfg.bus_bytes
        lw = log2(W)
        # A word read in one cycle (registered memory read) is at the memory's output the next and in
        # a register the cycle after, from which it is pushed: the block RAM's slow clock-to-output
        # and the bank multiplexer end in that register, not in the FIFO's rotation (Fmax). A read
        # is issued only when the FIFO will have room for it then, and again while the memory
        # refuses it. The word's first byte (at offset `ro`) must land at the FIFO's write pointer
        # as it will be then: that rotation is worked out with the read and travels with the word.
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
        S = fifo.cap
        assert S & (S - 1) == 0, "the rotation arithmetic wraps by truncation"
        # stage 1: read last cycle, the word at the memory's output; stage 2: the word registered,
        # pushed this cycle
        pend, pend_n, rot = Signal(), Signal(range(W + 1)), Signal(range(S))
        pend2, pend2_n, rot2 = Signal(), Signal(range(W + 1)), Signal(range(S))
        rdata = Signal(8 * W)
        want = Signal()
        m.d.comb += want.eq(active & ~empty & (r_row < f.rows) & (fifo.count + W * (1 + pend + pend2) <= S))
        m.d.comb += [sp.en.eq(want & ~from_acc), ap.en.eq(want & from_acc)]
        reading = Signal()  # the read goes out this cycle (the memory may refuse it)
        m.d.comb += reading.eq(want & Mux(from_acc, ap.grant, sp.grant))
        # the write pointer when this read's word is pushed (two cycles on): after this cycle's push
        # (stage 2, in `wptr_next`) and the next cycle's (stage 1's word)
        at_push = Signal(range(S))
        m.d.comb += at_push.eq(fifo.wptr_next + Mux(pend, pend_n, 0))
        m.d.sync += [
            pend.eq(reading),
            pend_n.eq(rn),
            rot.eq(at_push - ro),  # mod S
            pend2.eq(pend),
            pend2_n.eq(pend_n),
            rot2.eq(rot),
            rdata.eq(Mux(from_acc, ap.data, sp.data)),
        ]
        m.d.comb += [
            fifo.push_valid.eq(pend2),
            fifo.push_data.eq(rdata),
            fifo.push_rot.eq(rot2),
            fifo.push_n.eq(pend2_n),
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
        return SimpleNamespace(row=r_row, left=r_left, addr=r_addr, row_addr=r_row_addr, from_acc=from_acc)

    def _aw_issuer(self, m: Module, f, active, empty) -> SimpleNamespace:
        """The AW issuer: each row's DRAM words requested as AXI write bursts."""
        W = self.cfg.bus_bytes
        lw = log2(W)
        # The next burst's length and bytes are worked out the cycle after the address moves and
        # held in registers (`aw_calc`), so the burst arithmetic does not feed the handshake (Fmax).
        # The memory takes a write burst's address only after the previous burst's response, so the
        # cycle this costs after each accepted address is never one the memory would have used.
        aw_row = Signal(17)
        aw_addr = Signal(48)
        aw_left = Signal(17)
        aw_row_addr = Signal(48)
        aw_calc = Signal()  # aw_burst_r, aw_bytes_r and aw_row_end hold the burst at aw_addr
        aw_burst_r = Signal(9)
        aw_bytes_r = Signal(18)
        aw_row_end = Signal()  # the burst ends the row
        aw_more = Signal()  # rows are left to request
        here = burst_plan(m, aw_addr, aw_left, W, "aw_here")
        m.d.sync += [aw_burst_r.eq(here[0]), aw_bytes_r.eq(here[1]), aw_row_end.eq(here[2])]
        m.d.sync += aw_calc.eq(active)
        m.d.comb += [
            self.aw.payload.addr.eq(aw_addr[lw:32] << lw),
            self.aw.payload.len.eq(aw_burst_r - 1),
            self.aw.valid.eq(active & ~empty & aw_more & aw_calc),
        ]
        aw_sent = Signal(24)  # bursts whose address was accepted
        with m.If(self.aw.valid & self.aw.ready):
            m.d.sync += [aw_sent.eq(aw_sent + 1), aw_calc.eq(0)]
            with m.If(aw_row_end):
                m.d.sync += [
                    aw_more.eq(aw_row + 1 < f.rows),
                    aw_row.eq(aw_row + 1),
                    aw_row_addr.eq(aw_row_addr + f.dram_stride),
                    aw_addr.eq(aw_row_addr + f.dram_stride),
                    aw_left.eq(f.cols),
                ]
            with m.Else():
                m.d.sync += [aw_addr.eq(aw_addr + aw_bytes_r), aw_left.eq(aw_left - aw_bytes_r)]
        return SimpleNamespace(
            row=aw_row,
            addr=aw_addr,
            row_addr=aw_row_addr,
            left=aw_left,
            sent=aw_sent,
            calc=aw_calc,
            burst_r=aw_burst_r,
            bytes_r=aw_bytes_r,
            row_end=aw_row_end,
            more=aw_more,
        )

    def _w_writer(self, m: Module, f, fifo, active, empty, aw_sent) -> SimpleNamespace:
        """The W writer: FIFO bytes realigned to DRAM beats with strobes, burst by burst."""
        W = self.cfg.bus_bytes
        lw = log2(W)
        w_row = Signal(17)
        w_addr = Signal(48)
        w_left = Signal(17)  # bytes of the row still to write
        w_row_addr = Signal(48)
        w_burst_left = Signal(9)  # beats left in the current burst (0: start a new one)
        w_bursts = Signal(24)  # bursts completed
        # the burst a new W burst starts with, from the registers of the cycle before (as for AW);
        # a burst starts only after its address was accepted, which is after this settles
        w_calc = Signal()
        new_burst = Signal(9)
        m.d.sync += [new_burst.eq(burst_plan(m, w_addr, w_left, W, "w_next")[0]), w_calc.eq(active)]
        beats_left = Signal(9)
        m.d.comb += beats_left.eq(Mux(w_burst_left == 0, new_burst, w_burst_left))
        # the beat's first byte in the bus word and its byte count, min(W - wo, w_left), are
        # registers kept with w_addr and w_left (worked out from the values they are loaded with),
        # so the FIFO's "enough bytes" compare and the strobes do not wait on the address arithmetic
        wo = Signal(lw)
        wn = Signal(range(W + 1))
        can_w = Signal()
        w_more = Signal()  # rows are left to write
        settled = w_calc | (w_burst_left != 0)  # a new burst's length is known
        m.d.comb += can_w.eq(active & ~empty & w_more & (fifo.count >= wn) & (w_bursts < aw_sent) & settled)
        m.d.comb += [
            self.w.valid.eq(can_w),
            self.w.payload.data.eq(fifo.data << (wo * 8)),
            self.w.payload.strb.eq(low_bytes_mask(wn, W) << wo),
            self.w.payload.last.eq(beats_left == 1),
        ]
        with m.If(can_w & self.w.ready):
            m.d.comb += fifo.pop_n.eq(wn)
            m.d.sync += w_calc.eq(0)
            m.d.sync += w_burst_left.eq(beats_left - 1)
            with m.If(beats_left == 1):
                m.d.sync += w_bursts.eq(w_bursts + 1)
            with m.If(wn == w_left):
                row_wo = (w_row_addr[:lw] + f.dram_stride[:lw])[:lw]
                m.d.sync += [
                    w_more.eq(w_row + 1 < f.rows),
                    w_row.eq(w_row + 1),
                    w_row_addr.eq(w_row_addr + f.dram_stride),
                    w_addr.eq(w_row_addr + f.dram_stride),
                    w_left.eq(f.cols),
                    wo.eq(row_wo),
                    wn.eq(min_(W - row_wo, f.cols)),
                ]
            with m.Else():
                next_wo = (wo + wn)[:lw]
                m.d.sync += [
                    w_addr.eq(w_addr + wn),
                    w_left.eq(w_left - wn),
                    wo.eq(next_wo),
                    wn.eq(min_(W - next_wo, w_left - wn)),
                ]
        return SimpleNamespace(
            row=w_row,
            addr=w_addr,
            row_addr=w_row_addr,
            left=w_left,
            wo=wo,
            wn=wn,
            burst_left=w_burst_left,
            more=w_more,
            calc=w_calc,
            bursts=w_bursts,
        )

    def _completion(self, m: Module, active, empty, rd, aw, wr) -> None:
        """Write responses, completion, and the start of all three processes when an instruction goes."""
        W = self.cfg.bus_bytes
        # bursts whose address was taken and whose response has not come: the last response is then a
        # compare of this register with 0 or 1, not a 24-bit sum with the response (Fmax: the path
        # from the bus's BVALID through the completion into the token counters)
        unanswered = Signal(24)
        m.d.comb += self.b_ready.eq(1)
        aw_taken = self.aw.valid & self.aw.ready
        with m.If(aw_taken & ~self.b_valid):
            m.d.sync += unanswered.eq(unanswered + 1)
        with m.Elif(~aw_taken & self.b_valid):
            m.d.sync += unanswered.eq(unanswered - 1)
        last = Signal()  # every burst answered once this cycle's response (if any) is counted
        m.d.comb += last.eq(Mux(self.b_valid, unanswered == 1, unanswered == 0))
        finished = Signal()
        m.d.comb += finished.eq(active & (empty | (~wr.more & last)))
        m.d.comb += self.exec.done.eq(finished)
        with m.If(finished):
            m.d.sync += active.eq(0)
        with m.If(self.exec.go):
            nf = view(Opcode.STORE, self.exec.instr)
            first = burst_plan(m, nf.dram, nf.cols, W, "aw_first")
            m.d.sync += [
                active.eq(1),
                rd.row.eq(0),
                rd.left.eq(nf.cols),
                rd.addr.eq(nf.spad),
                rd.row_addr.eq(nf.spad),
                rd.from_acc.eq(is_acc(nf.spad)),
                aw.row.eq(0),
                aw.addr.eq(nf.dram),
                aw.row_addr.eq(nf.dram),
                aw.left.eq(nf.cols),
                aw.sent.eq(0),
                # the first burst straight from the instruction: the store starts as soon as before
                aw.calc.eq(1),
                aw.burst_r.eq(first[0]),
                aw.bytes_r.eq(first[1]),
                aw.row_end.eq(first[2]),
                aw.more.eq(nf.rows != 0),
                wr.row.eq(0),
                wr.addr.eq(nf.dram),
                wr.row_addr.eq(nf.dram),
                wr.left.eq(nf.cols),
                wr.wo.eq(nf.dram[: log2(W)]),
                wr.wn.eq(min_(W - nf.dram[: log2(W)], nf.cols)),
                wr.burst_left.eq(0),
                wr.more.eq(nf.rows != 0),
                wr.calc.eq(0),
                wr.bursts.eq(0),
                unanswered.eq(0),
            ]

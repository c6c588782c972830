"""Instruction fetch and the AXI read-channel arbiter.

The fetcher prefetches instructions in bursts into a small buffer; the arbiter shares the AXI read
address channel between the fetcher and the load unit and routes each burst's R beats back to the
requester in order (one outstanding-burst FIFO records the owner of every burst).
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig
from npu.isa import INSTR_BITS, INSTR_BYTES, ErrorCode

from .checks import CHECK_LATENCY, InstructionCheck
from .common import Fetched, beat_stream, burst_stream, log2, min_

OUTSTANDING = 8


class Fetcher(wiring.Component):
    """Prefetches instructions from `base + 32 * pc` while `enable`; `restart` flushes the buffer.

    With `ring_size` (bytes) non-zero at the restart, it fetches from the command ring instead:
    instruction pc at `base + 32 * (pc mod slots)`, only while pc < `tail` (absolute counts, mod
    2^32); `empty` then says every appended instruction has been handed out.

    `out` streams instructions with their pc; `bad` flags a pc whose address lies outside DRAM (or
    a misaligned base, or a ring that is not a power of two >= 32 bytes inside DRAM), its `code`
    DRAM_RANGE, or outside the memory window [`win_base`, `win_limit`) (0: no limit; a ring must lie
    inside it whole), its `code` PROTECTION, with the address in `bad_addr`: the dispatcher raises
    the error when it reaches it. No burst is requested outside DRAM or the window. `ar` requests
    bursts, `r` brings their beats.
    """

    BUF = 8

    def __init__(self, cfg: NpuConfig):
        self.cfg = cfg
        super().__init__(
            {
                "restart": In(1),
                "base": In(32),
                "start_pc": In(32),
                "ring_size": In(32),  # bytes; 0: no ring
                "tail": In(32),
                "win_base": In(32),  # the memory window, latched at the restart
                "win_limit": In(32),
                "bad_addr": Out(32),  # with a PROTECTION marker: the instruction's (or the ring's) address
                "enable": In(1),
                "empty": Out(1),  # ring mode and every appended instruction handed out
                "out": Out(stream.Signature(Fetched)),
                "ar": Out(burst_stream()),
                "r": In(beat_stream(cfg)),
                "r_err": In(1),  # the beat on `r` came with an error response
                "idle": Out(1),  # no burst outstanding
            }
        )

    @property
    def _beats(self) -> int:
        """Bus beats per instruction."""
        return max(1, INSTR_BYTES // self.cfg.bus_bytes)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        # + the fault bit and the check's code
        buf = fifo.SyncFIFOBuffered(width=INSTR_BITS + 1 + ErrorCode.as_shape().width, depth=self.BUF)
        m.submodules.buf = ResetInserter(self.restart)(buf)
        # instructions are checked on their way into the buffer (a pipeline without back-pressure:
        # the buffer has room for every instruction requested)
        m.submodules.check = check = InstructionCheck(cfg)
        in_check = Signal(range(CHECK_LATENCY + 1))  # instructions inside the check pipeline
        base = Signal(32)
        req_pc = Signal(32)  # next pc to request
        out_pc = Signal(32)  # pc of the buffer head
        inflight = Signal(range(self.BUF + 1))  # instructions requested, not yet in the buffer
        discard = Signal(16)  # beats of stale bursts (before a restart) still to drop
        bad_base = Signal()
        bad_win = Signal()  # the first instruction (or the ring) lies outside the window
        # the first pc past the window, minus 2 (non-ring mode; compared with out_pc, no adder)
        win_end_m2 = Signal(signed(36))
        ring = Signal()  # latched at the restart
        mask = Signal(32)  # slots - 1 in ring mode, all ones otherwise
        # the registers more than one part reads or writes
        st = SimpleNamespace(
            in_check=in_check,
            base=base,
            req_pc=req_pc,
            out_pc=out_pc,
            inflight=inflight,
            discard=discard,
            bad_base=bad_base,
            bad_win=bad_win,
            win_end_m2=win_end_m2,
            ring=ring,
            mask=mask,
        )

        req = self._requests(m, st, buf)
        asm = self._assemble(m, st, buf, check, req.n)
        out = self._output(m, st, buf)
        self._restart(m, st, req, asm, out)
        return m

    def _requests(self, m: Module, st, buf) -> SimpleNamespace:
        """The request side: AR bursts of up to 4 instructions while the buffer has room."""
        cfg = self.cfg
        # request bursts of up to 4 instructions while the buffer has room. `addr` (base + 32 * (req_pc
        # mod slots)) is a register that follows req_pc, so no 40-bit add precedes the burst limits
        # and the burst length feeding req_pc (Fmax)
        addr = Signal(40)
        room = Signal(range(self.BUF + 1))
        m.d.comb += room.eq(self.BUF - buf.level - st.inflight - st.in_check)
        # instructions left in DRAM, up to 4, as parallel compares of `addr` with constants instead of
        # a subtraction (Fmax); 0 past the end, where the old difference wrapped (no request either)
        fits = [Signal(name=f"dram_fits{k}") for k in range(1, 5)]
        m.d.comb += [f.eq(addr <= cfg.dram_bytes - k * INSTR_BYTES) for k, f in enumerate(fits, 1)]
        in_dram = fits[0]
        upto4_left = Signal(3)
        m.d.comb += upto4_left.eq(Mux(fits[3], 4, Mux(fits[2], 3, Mux(fits[1], 2, Mux(fits[0], 1, 0)))))
        to_4k = Signal(8)
        m.d.comb += to_4k.eq((4096 - addr[:12]) >> log2(INSTR_BYTES))
        # ring mode: no further than the tail, nor across the ring's end (the next burst wraps);
        # otherwise no further than the memory window's end. `to_end` (ring: mask - (req_pc & mask)
        # + 1; else the instructions left in the window) is a register that follows req_pc (Fmax)
        avail = Signal(32)
        m.d.comb += avail.eq(Mux(st.ring, self.tail - st.req_pc, 4))
        to_end = Signal(32, init=4)
        slots = Signal(32)  # mask + 1
        # each limit saturated at 4 first (an OR of its high bits), then the minimum of 3-bit values:
        # short paths instead of a chain of 32-bit compares (Fmax)
        limits = []
        for name, v in (
            ("room", room),
            ("to_4k", to_4k),
            ("avail", avail),
            ("end", to_end),
        ):
            s = Signal(3, name=f"upto4_{name}")
            m.d.comb += s.eq(Mux(v[2:].any(), 4, v[:2]))
            limits.append(s)
        limits.insert(2, upto4_left)
        n = Signal(4)
        m.d.comb += n.eq(min_(min_(limits[0], limits[1]), min_(min_(limits[2], limits[3]), limits[4])))
        m.d.comb += [
            self.ar.payload.addr.eq(addr),
            self.ar.payload.len.eq(n * self._beats - 1),
            self.ar.valid.eq(self.enable & ~st.bad_base & ~st.bad_win & in_dram & (n != 0) & (room >= 2)),
        ]
        # a burst never crosses the ring's end: one that reaches it wraps the address to the base
        wrap = Signal()
        m.d.comb += wrap.eq(st.ring & (to_end[3:] == 0) & (to_end[:3] == n))
        with m.If(self.ar.valid & self.ar.ready):
            m.d.sync += [
                st.req_pc.eq(st.req_pc + n),
                addr.eq(Mux(wrap, st.base, addr + (n << log2(INSTR_BYTES)))),
            ]
            m.d.sync += to_end.eq(Mux(wrap, slots, to_end - n))
        return SimpleNamespace(addr=addr, to_end=to_end, slots=slots, n=n)

    def _assemble(self, m: Module, st, buf, check, n) -> SimpleNamespace:
        """The R side: beats assembled into instructions, checked on their way into the buffer."""
        W = self.cfg.bus_bytes
        beats = self._beats
        word = Signal(INSTR_BITS)
        word_err = Signal()  # an earlier beat of this instruction came with an error
        beat = Signal(range(beats + 1))
        m.d.comb += self.r.ready.eq(1)
        r_data = self.r.payload
        got = Signal()
        with m.If(self.r.valid):
            with m.If(st.discard != 0):
                m.d.sync += st.discard.eq(st.discard - 1)
            with m.Else():
                if beats == 1:
                    m.d.comb += got.eq(1)
                    m.d.comb += [check.word.eq(r_data), check.extra.eq(self.r_err)]
                else:
                    m.d.sync += word.eq(Cat(word[8 * W :], r_data))
                    with m.If(beat == beats - 1):
                        m.d.comb += [got.eq(1), check.extra.eq(word_err | self.r_err)]
                        m.d.sync += [beat.eq(0), word_err.eq(0)]
                    with m.Else():
                        m.d.sync += [beat.eq(beat + 1), word_err.eq(word_err | self.r_err)]
        if beats > 1:
            # the check's word is qualified by its valid: no multiplexer on the handshake before the
            # check's first stage, whose operand adders then start from `word` (Fmax)
            m.d.comb += check.word.eq(Cat(word[8 * W :], r_data))
        m.d.comb += [
            check.valid.eq(got),
            check.flush.eq(self.restart),
            buf.w_data.eq(Cat(check.out_word, check.out_extra, check.code)),
            buf.w_en.eq(check.out_valid),
        ]
        issued = Signal(range(self.BUF + 1))
        m.d.comb += issued.eq(Mux(self.ar.valid & self.ar.ready, n, 0))
        m.d.sync += [
            st.inflight.eq(st.inflight + issued - got),
            st.in_check.eq(st.in_check + got - check.out_valid),
        ]
        return SimpleNamespace(beat=beat, word_err=word_err)

    def _past_dram(self, b, msk, pc):
        """Whether pc's instruction lies past DRAM's end (base `b`, slot mask `msk`)."""
        return b + ((pc & msk) << log2(INSTR_BYTES)) > self.cfg.dram_bytes - INSTR_BYTES

    def _output(self, m: Module, st, buf) -> SimpleNamespace:
        """The output: the head of the buffer, or a "bad" marker once requests ran off DRAM or the
        memory window."""
        # "pc's instruction lies past DRAM's end" (and "past the window") for out_pc and out_pc + 1
        # in registers, so the 40-bit compare does not sit between out_pc and the dispatcher's halt
        # logic (Fmax)
        past_head, past_next = Signal(), Signal()
        win_head, win_next = Signal(), Signal()
        head_bad = Signal()
        m.d.comb += head_bad.eq(st.bad_base | past_head | st.bad_win | win_head)
        m.d.comb += self.empty.eq(st.ring & (st.out_pc == self.tail))
        m.d.comb += [
            self.out.valid.eq(
                self.enable & (buf.r_rdy | (head_bad & (st.inflight == 0) & (st.in_check == 0) & ~self.empty))
            ),
            self.out.payload.instr.eq(buf.r_data[:INSTR_BITS]),
            self.out.payload.fault.eq(buf.r_data[INSTR_BITS] & buf.r_rdy),
            # a marker's code: DRAM_RANGE first (the model's order), else the window's PROTECTION
            self.out.payload.code.eq(
                Mux(
                    buf.r_rdy,
                    buf.r_data[INSTR_BITS + 1 :],
                    Mux(st.bad_base | past_head, ErrorCode.DRAM_RANGE, ErrorCode.PROTECTION),
                )
            ),
            self.bad_addr.eq(Mux(st.ring, st.base, st.base + (st.out_pc << log2(INSTR_BYTES)))),
            self.out.payload.pc.eq(st.out_pc),
            self.out.payload.bad.eq(head_bad & ~buf.r_rdy),
            buf.r_en.eq(self.out.ready & buf.r_rdy),
        ]
        with m.If(self.out.ready & buf.r_rdy):
            m.d.sync += [
                st.out_pc.eq(st.out_pc + 1),
                past_head.eq(past_next),
                past_next.eq(self._past_dram(st.base, st.mask, st.out_pc + 2)),
                win_head.eq(win_next),
                win_next.eq(~st.ring & (st.out_pc >= st.win_end_m2)),  # out_pc + 2 past the window
            ]
        m.d.comb += self.idle.eq((st.inflight == 0) & (st.discard == 0))
        return SimpleNamespace(past_head=past_head, past_next=past_next, win_head=win_head, win_next=win_next)

    def _restart(self, m: Module, st, req, asm, out) -> None:
        """The restart: the new stream's registers latched, stale bursts' beats counted to drop."""
        cfg = self.cfg
        # beats of bursts in flight that belong to the old stream after a restart
        stale = Signal(16)
        m.d.comb += stale.eq(
            st.discard
            + st.inflight * self._beats
            - asm.beat
            - (self.r.valid & (st.discard == 0))
            - (self.r.valid & (st.discard != 0))
        )
        # The new stream's addresses are worked out a cycle ahead, every cycle, from the registers
        # (base, start pc, ring size, window): those change only by register writes, and START
        # follows the CONTROL write by a cycle, so at a restart these registers hold the values
        # the restart reads; the restart itself only compares and adds once (Fmax: the chain
        # ring size -> mask -> first address -> window distance -> window end was the board's
        # critical path)
        size, base, start_pc = Signal(32), Signal(32), Signal(32)
        new_mask, first_addr, win_hi = Signal(32), Signal(40), Signal(33)
        win_base, ring_ok, ring_to_end = Signal(32), Signal(), Signal(33)
        mask_now = Signal(32)
        m.d.comb += mask_now.eq(
            Mux(self.ring_size != 0, (self.ring_size >> log2(INSTR_BYTES)) - 1, 0xFFFFFFFF)
        )
        masked_now = self.start_pc & mask_now
        m.d.sync += [
            size.eq(self.ring_size),
            base.eq(self.base),
            start_pc.eq(self.start_pc),
            win_base.eq(self.win_base),
            new_mask.eq(mask_now),
            first_addr.eq(self.base + (masked_now << log2(INSTR_BYTES))),
            # the window: [win_base, win_hi), win_hi = 2^32 for a limit of 0
            win_hi.eq(Mux(self.win_limit == 0, 1 << 32, self.win_limit)),
            ring_ok.eq(
                (self.ring_size >= INSTR_BYTES)
                & ((self.ring_size & (self.ring_size - 1)) == 0)
                & (self.base + self.ring_size <= cfg.dram_bytes)
            ),
            ring_to_end.eq(mask_now - masked_now + 1),
        ]
        left = Signal(33)  # instructions from the first one to the window's end (non-ring mode)
        check = m.submodules.check
        with m.If(self.restart):  # the window LOAD and STORE are checked against, for the run
            m.d.sync += [check.win_base.eq(win_base), check.win_hi.eq(win_hi)]
        m.d.comb += left.eq(Mux(first_addr >= win_hi, 0, (win_hi - first_addr) >> log2(INSTR_BYTES)))
        outside = Mux(size != 0, (base < win_base) | (base + size > win_hi),
                      first_addr < win_base)  # fmt: skip
        with m.If(self.restart):
            m.d.sync += [
                st.bad_win.eq(outside),
                st.win_end_m2.eq(start_pc + left - 2),
                out.win_head.eq((size == 0) & (left == 0)),
                out.win_next.eq((size == 0) & (left <= 1)),
            ]
            m.d.sync += [
                st.base.eq(base),
                st.ring.eq(size != 0),
                st.mask.eq(new_mask),
                req.addr.eq(first_addr),
                req.to_end.eq(Mux(size != 0, ring_to_end, left)),
                req.slots.eq(new_mask + 1),
                st.bad_base.eq((base[: log2(INSTR_BYTES)] != 0) | ((size != 0) & ~ring_ok)),
                st.req_pc.eq(start_pc),
                st.out_pc.eq(start_pc),
                out.past_head.eq(self._past_dram(base, new_mask, start_pc)),
                out.past_next.eq(self._past_dram(base, new_mask, start_pc + 1)),
                st.inflight.eq(0),
                st.in_check.eq(0),
                st.discard.eq(stale),
                asm.beat.eq(0),
                asm.word_err.eq(0),
            ]


class ReadArbiter(wiring.Component):
    """Shares the AXI AR/R channels between two requesters (0: fetch, 1: load): `ar0`/`ar1` take
    their burst requests, `r0`/`r1` return each burst's beats to its requester in order."""

    def __init__(self, cfg: NpuConfig):
        W = cfg.bus_bytes
        super().__init__(
            {
                "ar0": In(burst_stream()),
                "ar1": In(burst_stream()),
                "r0": Out(beat_stream(cfg)),
                "r1": Out(beat_stream(cfg)),
                "m_araddr": Out(32),
                "m_arlen": Out(8),
                "m_arvalid": Out(1),
                "m_arready": In(1),
                "m_rvalid": In(1),
                "m_rready": Out(1),
                "m_rlast": In(1),
                "m_rdata": In(8 * W),
                "m_rresp": In(2),
                "r0_err": Out(1),  # with an r0/r1 beat: the memory answered it with SLVERR/DECERR
                "r1_err": Out(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        m.submodules.owners = owners = fifo.SyncFIFOBuffered(width=1, depth=OUTSTANDING)
        last_grant = Signal()
        pick = Signal()  # requester granted this cycle if it asks
        # the fetcher's request waits in a register (taken when it is empty): no path runs from the
        # fetcher's burst arithmetic through the grant into the load unit's request (Fmax); a fetch
        # burst is 4 instructions, so one request per two cycles is more than the fetcher needs
        r0 = Signal.like(self.ar0.payload)
        v0 = Signal()
        v1 = self.ar1.valid
        m.d.comb += pick.eq(Mux(v0 & v1, ~last_grant, v1))
        can = owners.w_rdy
        m.d.comb += [
            self.m_araddr.eq(Mux(pick, self.ar1.payload.addr, r0.addr)),
            self.m_arlen.eq(Mux(pick, self.ar1.payload.len, r0.len)),
            self.m_arvalid.eq((v0 | v1) & can),
            self.ar0.ready.eq(~v0),
            self.ar1.ready.eq(self.m_arready & can & pick),
            owners.w_data.eq(pick),
            owners.w_en.eq(self.m_arvalid & self.m_arready),
        ]
        with m.If(self.ar0.valid & ~v0):
            m.d.sync += [v0.eq(1), r0.eq(self.ar0.payload)]
        with m.Elif(self.m_arready & can & ~pick):
            m.d.sync += v0.eq(0)
        with m.If(self.m_arvalid & self.m_arready):
            m.d.sync += last_grant.eq(pick)
        owner = owners.r_data
        m.d.comb += [
            self.r0.payload.eq(self.m_rdata),
            self.r1.payload.eq(self.m_rdata),
            self.r0.valid.eq(self.m_rvalid & owners.r_rdy & ~owner),
            self.r1.valid.eq(self.m_rvalid & owners.r_rdy & owner),
            self.m_rready.eq(owners.r_rdy & Mux(owner, self.r1.ready, self.r0.ready)),
            owners.r_en.eq(self.m_rvalid & self.m_rready & self.m_rlast),
            self.r0_err.eq(self.m_rresp[1]),
            self.r1_err.eq(self.m_rresp[1]),
        ]
        return m

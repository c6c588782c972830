"""The board side of the serial protocol (version 2, docs/driver.md) in RTL: UART in, AXI out.

`SerialBridge` answers the unchanged host `npu.driver.serial.SerialTransport` as the reference bridge
`npu.driver.serial.serve` does: it is the AXI4-Lite master of the core's registers (`regs`) and an
AXI4 master of the board DRAM (`dram`, through the board top's arbiter), with the UARTs inside
(`rx` / `tx` pins).

Datapath, a byte at a time, with two block RAMs of one read and one write port each:

* receive: UART -> COBS decoder -> request memory and CRC-32; the sequence number, command and the
  first 8 payload bytes are also kept in registers. At the 0x00 delimiter a frame with a bad
  encoding, a framing error, fewer than 7 bytes or a bad CRC is damaged: the answer is RESEND with
  sequence number 0 (a constant frame). An empty frame is ignored.
* sequence: with a remembered reply and a command other than HELLO, the same sequence number is
  answered from the reply memory without executing again, an older one (`(last - seq) mod 2^16` in
  1..0x7fff, as `serve`) is ignored, anything else is executed.
* execute: the reply (sequence, status, payload, CRC) is COBS-encoded into the reply memory as it
  is made: a block's code byte goes into the slot kept for it when the block ends (a zero byte,
  254 others, the end), so the stored reply is sent as it is, and sent again for a repeat. DRAM
  reads go from the AXI read data straight into the reply (single-beat reads of whole words, the
  wanted bytes taken), DRAM writes gather the request's bytes into a word and its strobes
  (single-beat writes with `wstrb`): any address and count. A register read goes out while the
  slave holds its data.
* CRC-32 (`amaranth.lib.crc`, IEEE as `binascii.crc32`) is computed bit-serially, 8 cycles a byte,
  one unit for both ways (frames are received only while no request executes).

While a request executes and its reply goes out, received frames are dropped whole (the host sends
its next request only after the reply, and retries a dropped one after its timeout).

WAIT reads STATUS (`status_offset`) over `regs`, as `serve` asks the device: a running core is
polled every 16 cycles until it leaves RUNNING, the `irq` input rises (a FENCE completed; the
simulation transport's wait ends there too) or min(limit, 2^20) cycles have passed; a core that is
not running is waited for the limit (not at all without one). The reply is the cycles waited and
`finished` (STATUS not RUNNING afterwards, and the core was running or no limit was given). NOW
replies the cycles since reset (the counter holds while its 8 bytes are taken and catches up).

An AXI error response (SLVERR / DECERR) on any access of a request makes its reply status 5 (the
device failed) without payload. `max_packet` (at most 4096) is the DRAM payload HELLO advertises;
it sizes both memories (a power of two holding the largest request and the largest encoded reply):
256 -> 512 bytes each, one iCE40 EBR each.

Cost (yosys 0.23 `synth_ice40`, W=64, 8 MiB DRAM, max_packet 256): about 1270 LUT4, 525 flip-flops
and 2 EBR; W=32 with 128 KiB of DRAM (the iCEBreaker) a little less.
"""

from __future__ import annotations

import struct

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.crc import catalog
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu.registers import REG, Status
from npu.serial_protocol import (
    BAD_ADDRESS,
    BAD_COMMAND,
    BAD_LENGTH,
    BAD_VERSION,
    DEVICE_ERROR,
    HELLO,
    MAGIC,
    MAX_CHUNK,
    NOW,
    OK,
    READ_DRAM,
    READ_REG,
    RESEND,
    VERSION,
    WAIT,
    WAIT_SLICE,
    WRITE_DRAM,
    WRITE_REG,
    encode_frame,
)

from ..axi import AxiLiteSignature, AxiSignature, address_and_data
from .uart import UartRx, UartTx, divisor_of

#: bytes of a frame besides its payload: sequence (2), command or status (1), CRC (4)
FRAME_OVERHEAD = 7

# payload sources of a reply
_NONE, _ROM, _VER, _NOW, _WAIT, _REG, _DRAM = range(7)


class SerialBridge(wiring.Component):
    """Protocol v2 bridge: `rx` / `tx` UART pins, `regs` AXI4-Lite master, `dram` AXI4 master, `irq`
    (optional, the core's interrupt line: ends a WAIT on a completed FENCE).

    Parameters: `dram_bytes` (the DRAM size HELLO reports, checked on every DRAM access),
    `data_width` (of `dram`: 32, 64 or 128), the bit rate as `clk_freq` and `baud` (or `divisor`,
    clock cycles per bit, >= 4), `max_packet` (DRAM payload per packet), `reg_addr_width`,
    `dram_addr_width`, `id_width` and `status_offset` (STATUS in the register window)."""

    def __init__(
        self,
        *,
        dram_bytes: int,
        data_width: int = 64,
        clk_freq: float | None = None,
        baud: float | None = None,
        divisor: int | None = None,
        max_packet: int = 256,
        reg_addr_width: int = 8,
        dram_addr_width: int = 32,
        id_width: int = 4,
        status_offset: int = REG["STATUS"].offset,
    ):
        if data_width not in (32, 64, 128):
            raise ValueError(f"data_width must be 32, 64 or 128, not {data_width}")
        if not 1 <= max_packet <= MAX_CHUNK:
            raise ValueError(f"max_packet must be 1..{MAX_CHUNK}, not {max_packet}")
        if not 0 < dram_bytes <= min(1 << 32, 1 << dram_addr_width):
            raise ValueError(f"dram_bytes {dram_bytes} does not fit {dram_addr_width} address bits")
        if divisor is None:
            if clk_freq is None or baud is None:
                raise ValueError("give clk_freq and baud, or divisor")
            divisor = divisor_of(clk_freq, baud)
        if divisor < 4:
            raise ValueError("the UART needs at least 4 clock cycles per bit")
        self.dram_bytes, self.data_width, self.divisor = dram_bytes, data_width, divisor
        self.max_packet, self.status_offset = max_packet, status_offset
        self.reg_addr_width, self.dram_addr_width = reg_addr_width, dram_addr_width
        #: bytes of each of the two memories: the largest request, the largest reply COBS-encoded
        request = FRAME_OVERHEAD + 4 + max_packet
        reply = FRAME_OVERHEAD + max(max_packet, 11)
        self.mem_depth = 1 << (max(request, reply + reply // 254 + 1) - 1).bit_length()
        dram = AxiSignature(data_width=data_width, addr_width=dram_addr_width, id_width=id_width)
        super().__init__(
            {
                "rx": In(1, init=1),
                "tx": Out(1, init=1),
                "irq": In(1),
                "regs": Out(AxiLiteSignature(addr_width=reg_addr_width)),
                "dram": Out(dram),
            }
        )

    def elaborate(self, platform):
        m = Module()
        D = self.mem_depth
        AB = D.bit_length() - 1  # memory address bits
        IB = AB + 1  # frame byte counts (saturating at 2 * D - 1)
        LB = (self.data_width // 8).bit_length() - 1  # byte lane bits
        LANES = self.data_width // 8
        regs, dram = self.regs, self.dram

        m.submodules.urx = urx = UartRx(self.divisor)
        m.submodules.utx = utx = UartTx(self.divisor)
        m.d.comb += [urx.rx.eq(self.rx), self.tx.eq(utx.tx)]
        # CRC-32 bit-serially (8 cycles a byte, LSB first as the reflected algorithm takes it)
        m.submodules.crc = crc = catalog.CRC32_ISO_HDLC(data_width=1).create()
        m.submodules.req = req = Memory(shape=8, depth=D, init=[])
        m.submodules.rep = rep = Memory(shape=8, depth=D, init=[])
        req_w, req_r = req.write_port(), req.read_port()
        rep_w, rep_r = rep.write_port(), rep.read_port()

        now = Signal(64)  # cycles since reset

        busy = Signal()  # a request executes or a reply goes out

        # ---- receive: COBS decoding, request fields, CRC -------------------------------------
        seq = Signal(16)
        cmd = Signal(8)
        P = Signal(64)  # payload bytes 0..7; the DRAM address and count count down in it
        flen = Signal(IB)  # decoded bytes of the frame being executed
        left = Signal(8)  # data bytes left in the current COBS block
        last_ff = Signal()  # the current block's code was 0xFF (no zero follows it)
        started = Signal()  # a code byte was seen in this frame
        got = Signal()  # any byte since the last delimiter
        bad = Signal()  # a framing error in this frame
        dropping = Signal()  # bytes arrived while busy: drop this frame whole
        idx = Signal(IB)  # decoded bytes so far
        rx_ok, rx_damaged = Signal(), Signal()
        dec_valid, dec_byte = Signal(), Signal(8)
        byte = urx.stream.payload

        with m.If(urx.error):
            with m.If(busy):
                m.d.sync += dropping.eq(1)
            with m.Else():
                m.d.sync += [bad.eq(1), got.eq(1)]
        with m.If(urx.stream.valid):
            with m.If(byte == 0):
                m.d.sync += [
                    left.eq(0),
                    last_ff.eq(0),
                    started.eq(0),
                    got.eq(0),
                    bad.eq(0),
                    dropping.eq(0),
                    idx.eq(0),
                ]
                with m.If(~busy & ~dropping & got):
                    damaged = bad | (left != 0) | (idx < FRAME_OVERHEAD) | ~crc.match_detected
                    m.d.comb += [rx_damaged.eq(damaged), rx_ok.eq(~damaged)]
                    m.d.sync += flen.eq(idx)
            with m.Elif(busy):
                m.d.sync += dropping.eq(1)
            with m.Else():
                m.d.sync += got.eq(1)
                with m.If(left == 0):  # a code byte: the zero ending the previous block first
                    m.d.sync += [left.eq(byte - 1), last_ff.eq(byte == 0xFF), started.eq(1)]
                    m.d.comb += [dec_valid.eq(started & ~last_ff), dec_byte.eq(0)]
                with m.Else():
                    m.d.sync += left.eq(left - 1)
                    m.d.comb += [dec_valid.eq(1), dec_byte.eq(byte)]
        m.d.comb += [req_w.addr.eq(idx), req_w.data.eq(dec_byte), req_w.en.eq(dec_valid & ~idx[AB])]
        with m.If(dec_valid):
            with m.If(idx != (1 << IB) - 1):
                m.d.sync += idx.eq(idx + 1)
            with m.Switch(idx):
                with m.Case(0):
                    m.d.sync += seq[:8].eq(dec_byte)
                with m.Case(1):
                    m.d.sync += seq[8:].eq(dec_byte)
                with m.Case(2):
                    m.d.sync += cmd.eq(dec_byte)
                for i in range(8):
                    with m.Case(3 + i):
                        m.d.sync += P[8 * i : 8 * i + 8].eq(dec_byte)

        # ---- reply writer: the reply is COBS-encoded into the reply memory as it is written (and,
        # but for the CRC, goes through the CRC): a block's code byte is written into the slot kept
        # for it when the block ends (at a zero byte, after 254 others, at the end of the reply)
        e_valid, e_byte, e_feed = Signal(), Signal(8), Signal()
        e_ready = Signal()  # a byte may be given (the stage is empty, the CRC and the encoder ready)
        # the byte given goes through a register (`s_*`) to the encoder and the CRC, which take it the
        # next cycle: the reply's byte multiplexers and the encoder's zero test were one long path
        s_valid, s_byte, s_feed, s_first = Signal(), Signal(8), Signal(), Signal()
        wptr = Signal(IB)  # the next free slot
        code_pos = Signal(IB)  # the slot of the current block's code
        run = Signal(8)  # bytes in the current block
        pend = Signal()  # the block is full: close it before the next byte
        close = Signal()  # close the block (also at the end of the reply)
        use_code = Signal()
        m.d.comb += [
            use_code.eq(close | (s_valid & (s_byte == 0))),
            rep_w.addr.eq(Mux(use_code, code_pos, wptr)),
            rep_w.data.eq(Mux(use_code, run + 1, s_byte)),
            rep_w.en.eq(s_valid | close),
        ]
        with m.If(use_code):
            m.d.sync += [code_pos.eq(wptr), wptr.eq(wptr + 1), run.eq(0), pend.eq(0)]
        with m.Elif(s_valid):
            m.d.sync += [wptr.eq(wptr + 1), run.eq(run + 1), pend.eq(run == 253)]
        with m.If(pend):
            m.d.comb += close.eq(1)
        # one CRC for both ways (frames are received only while no request executes), a byte at a
        # time through a shift register; the reply writer waits for it (`c_ready`)
        c_sh = Signal(8)
        c_bits = Signal(4)  # bits of c_sh still to go
        c_start = Signal()  # restart the CRC with the next bit
        c_ready = Signal()
        hk = Signal(2)  # header byte index
        m.d.sync += [s_valid.eq(e_valid), s_byte.eq(e_byte), s_feed.eq(e_feed), s_first.eq(hk == 0)]
        m.d.comb += [
            c_ready.eq(c_bits == 0),
            e_ready.eq(c_ready & ~pend & ~s_valid),
            crc.data.eq(c_sh[0]),
            crc.valid.eq(c_bits != 0),
            crc.start.eq(c_start & (c_bits != 0)),
        ]
        with m.If(c_bits != 0):
            m.d.sync += [c_sh.eq(c_sh >> 1), c_bits.eq(c_bits - 1), c_start.eq(0)]
        with m.If(Mux(busy, s_valid & s_feed, dec_valid)):
            m.d.sync += [
                c_sh.eq(Mux(busy, s_byte, dec_byte)),
                c_bits.eq(8),
                c_start.eq(Mux(busy, s_first, idx == 0)),
            ]

        # ---- executor state -----------------------------------------------------------------
        status = Signal(3)
        kind = Signal(3)  # the payload source of the reply
        k = Signal(4)  # byte index within a reply part
        axerr = Signal()  # an AXI error response during this request
        last_seq = Signal(16)
        last_valid = Signal()
        rlen = Signal(IB)  # bytes of the remembered reply
        rptr = Signal(IB)  # request memory read pointer (WRITE_DRAM data)
        wbuf = Signal(self.data_width)
        wstb = Signal(LANES)
        aw_done, w_done = Signal(), Signal()
        sptr = Signal(IB)  # send pointer

        addr, count = P[:32], P[32:48]
        # a DRAM access counts only the bits that can change: the address below the DRAM size (the
        # range check passed), the count below 2 * max_packet (the length check passed)
        AW = max(1, (self.dram_bytes - 1).bit_length())
        CW = self.max_packet.bit_length()
        cnt = count[:CW]
        lane = P[:LB]
        # frame lengths against constants (the payload is flen - 7 bytes)
        plen_is = lambda n: flen == n + FRAME_OVERHEAD  # noqa: E731
        # DRAM range check (READ_DRAM: count, WRITE_DRAM: the payload after the address)
        span = Signal(16)
        m.d.comb += span.eq(Mux(cmd == READ_DRAM, count, flen - (FRAME_OVERHEAD + 4)))
        over = Signal()
        m.d.comb += over.eq(_beyond(addr, span, self.dram_bytes, self.max_packet))
        age = Signal(16)
        m.d.comb += age.eq(last_seq - seq)
        is_running = regs.rdata[:6] == int(Status.RUNNING)

        # HELLO's reply payload
        hello = MAGIC + struct.pack("<BIH", VERSION, self.dram_bytes & 0xFFFFFFFF, self.max_packet)
        resend = encode_frame(0, RESEND, b"")

        # ---- WAIT: a slice of min(limit, 2^20) cycles, ended early by a rising `irq` of a running core
        wcnt = Signal(21)  # cycles waited
        counting = Signal()
        running = Signal()  # STATUS was RUNNING when the WAIT began
        finished = Signal()
        irq_prev = Signal()
        w_init, w_fin = Signal(), Signal()  # the STATUS read being made is the first / the last
        no_limit = addr == 0xFFFFFFFF
        # the count stops at the limit: bit 20 set means 2^20 (the slice)
        assert WAIT_SLICE == 1 << 20
        at_lim = wcnt[20] | ((addr[20:] == 0) & (wcnt[:20] == addr[:20]))
        with m.If(counting):
            m.d.sync += irq_prev.eq(self.irq)
            with m.If(at_lim | (running & self.irq & ~irq_prev)):
                m.d.sync += counting.eq(0)
            with m.Else():
                m.d.sync += wcnt.eq(wcnt + 1)

        # ---- NOW: the counter holds while its bytes go out, and catches up afterwards
        freeze = Signal()
        lag = Signal(7)
        with m.If(freeze):
            m.d.sync += lag.eq(lag + 1)
        with m.Else():
            m.d.sync += [now.eq(now + (lag + 1)), lag.eq(0)]

        # constant AXI fields: single beats of a whole word, id 0
        m.d.comb += [
            dram.arsize.eq(LB),
            dram.awsize.eq(LB),
            dram.arburst.eq(1),
            dram.awburst.eq(1),
            dram.araddr.eq(Cat(Const(0, LB), addr[LB:AW])),
            dram.awaddr.eq(Cat(Const(0, LB), addr[LB:AW])),
            dram.wdata.eq(wbuf),
            dram.wstrb.eq(wstb),
            dram.wlast.eq(1),
            regs.araddr.eq(Mux(cmd == WAIT, self.status_offset, addr)),
            regs.awaddr.eq(addr),
            regs.wdata.eq(P[32:64]),
            regs.wstrb.eq(0xF),
            req_r.addr.eq(rptr),
        ]

        # the payload bytes of the value kinds
        vbyte = Signal(8)
        with m.Switch(kind):
            with m.Case(_ROM):
                with m.Switch(k):
                    for i, b in enumerate(hello):
                        with m.Case(i):
                            m.d.comb += vbyte.eq(b)
            with m.Case(_VER):  # a BAD_VERSION reply carries the version spoken here
                m.d.comb += vbyte.eq(VERSION)
            with m.Case(_NOW):
                m.d.comb += vbyte.eq(_byte(m, now, k[:3]))
            with m.Case(_WAIT):
                m.d.comb += vbyte.eq(_byte(m, Cat(wcnt, Const(0, 11), finished), k[:3]))
            with m.Case(_REG):
                m.d.comb += vbyte.eq(_byte(m, regs.rdata, k[:2]))

        # the last byte index of each value kind
        kend = Signal(4)
        with m.Switch(kind):
            for knd, last in ((_ROM, len(hello) - 1), (_NOW, 7), (_WAIT, 4), (_REG, 3)):
                with m.Case(knd):
                    m.d.comb += kend.eq(last)

        def reply(m, st, knd):
            m.d.sync += [status.eq(st), kind.eq(knd)]
            m.next = "HDR"

        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.sync += [axerr.eq(0), k.eq(0), aw_done.eq(0), w_done.eq(0), sptr.eq(0)]
                m.d.sync += [wptr.eq(1), code_pos.eq(0), run.eq(0), hk.eq(0)]
                with m.If(rx_damaged):
                    m.next = "RESEND"
                with m.Elif(rx_ok):
                    repeat = last_valid & (cmd != HELLO)
                    with m.If(repeat & (age == 0)):
                        m.next = "SEND_A"
                    with m.Elif(~(repeat & ~age[15])):
                        m.next = "DECODE"
            with m.State("DECODE"):
                with m.Switch(cmd):
                    with m.Case(HELLO):
                        with m.If(~plen_is(1)):
                            reply(m, BAD_LENGTH, _NONE)
                        with m.Elif(P[:8] != VERSION):
                            reply(m, BAD_VERSION, _VER)
                        with m.Else():
                            reply(m, OK, _ROM)
                    with m.Case(READ_REG):
                        with m.If(~plen_is(4)):
                            reply(m, BAD_LENGTH, _NONE)
                        with m.Else():
                            m.next = "RR_AR"
                    with m.Case(WRITE_REG):
                        with m.If(~plen_is(8)):
                            reply(m, BAD_LENGTH, _NONE)
                        with m.Else():
                            m.next = "WR_AW"
                    with m.Case(READ_DRAM):
                        with m.If(~plen_is(6) | (count > self.max_packet)):
                            reply(m, BAD_LENGTH, _NONE)
                        with m.Elif(over):
                            reply(m, BAD_ADDRESS, _NONE)
                        with m.Else():
                            reply(m, OK, _DRAM)
                    with m.Case(WRITE_DRAM):
                        n = FRAME_OVERHEAD + 4  # frame bytes without data
                        with m.If((flen < n) | (flen > n + self.max_packet)):
                            reply(m, BAD_LENGTH, _NONE)
                        with m.Elif(over):
                            reply(m, BAD_ADDRESS, _NONE)
                        with m.Else():
                            m.d.sync += [rptr.eq(FRAME_OVERHEAD), wstb.eq(0)]
                            m.next = "WD_FETCH"
                    with m.Case(WAIT):
                        with m.If(~plen_is(4)):
                            reply(m, BAD_LENGTH, _NONE)
                        with m.Else():
                            m.d.sync += [w_init.eq(1), w_fin.eq(0)]
                            m.next = "W_AR"
                    with m.Case(NOW):
                        with m.If(~plen_is(0)):
                            reply(m, BAD_LENGTH, _NONE)
                        with m.Else():
                            reply(m, OK, _NOW)
                    with m.Default():
                        reply(m, BAD_COMMAND, _NONE)

            # -- the reply: header, payload, CRC --------------------------------------------------
            with m.State("HDR"):
                m.d.comb += [e_valid.eq(e_ready), e_feed.eq(1)]
                m.d.comb += e_byte.eq(Mux(hk == 0, seq[:8], Mux(hk == 1, seq[8:], status)))
                with m.If(e_ready):
                    m.d.sync += hk.eq(hk + 1)
                with m.If(e_ready & (hk == 2)):
                    with m.Switch(kind):
                        with m.Case(_NONE):
                            m.d.sync += k.eq(0)
                            m.next = "CRC"
                        with m.Case(_DRAM):
                            m.next = "RD_AR"
                        with m.Default():
                            m.next = "VAL"
            with m.State("VAL"):  # bytes k..kend of a value (HELLO's, NOW, WAIT, a register)
                m.d.comb += [e_valid.eq(e_ready), e_feed.eq(1), e_byte.eq(vbyte), freeze.eq(kind == _NOW)]
                with m.If(e_ready):
                    m.d.sync += k.eq(k + 1)
                with m.If(e_ready & (k == kend)):
                    m.d.comb += regs.rready.eq(kind == _REG)
                    m.d.sync += k.eq(0)
                    m.next = "CRC"
            with m.State("CRC"):
                m.d.comb += [e_valid.eq(e_ready), e_byte.eq(_byte(m, crc.crc, k[:2]))]
                with m.If(e_ready):
                    m.d.sync += k.eq(k + 1)
                with m.If(e_ready & (k == 3)):
                    m.next = "LAST"
            with m.State("LAST"):  # close the last block: the reply is complete
                with m.If(~pend & ~s_valid):
                    m.d.comb += close.eq(1)
                    m.d.sync += [rlen.eq(wptr), last_seq.eq(seq), last_valid.eq(1)]
                    m.next = "SEND_A"
            with m.State("ACT_END"):  # after an access: a failed one replies DEVICE_ERROR
                with m.If(axerr):
                    m.d.sync += [status.eq(DEVICE_ERROR), kind.eq(_NONE)]
                    m.d.sync += [wptr.eq(1), code_pos.eq(0), run.eq(0), hk.eq(0)]
                    m.next = "HDR"
                with m.Elif(kind == _DRAM):
                    m.d.sync += k.eq(0)
                    m.next = "CRC"
                with m.Else():
                    m.next = "HDR"

            # -- READ_REG (its data is sent while the slave holds it) / WRITE_REG ---------------
            with m.State("RR_AR"):
                m.d.comb += regs.arvalid.eq(1)
                with m.If(regs.arready):
                    m.next = "RR_R"
            with m.State("RR_R"):
                with m.If(regs.rvalid):
                    with m.If(regs.rresp != 0):
                        m.d.comb += regs.rready.eq(1)
                        reply(m, DEVICE_ERROR, _NONE)
                    with m.Else():
                        reply(m, OK, _REG)
            with m.State("WR_AW"):
                with m.If(address_and_data(m, regs, aw_done, w_done)):
                    m.next = "WR_B"
            with m.State("WR_B"):
                m.d.comb += regs.bready.eq(1)
                with m.If(regs.bvalid):
                    with m.If(regs.bresp != 0):
                        reply(m, DEVICE_ERROR, _NONE)
                    with m.Else():
                        reply(m, OK, _NONE)

            # -- READ_DRAM: single-beat reads, the wanted bytes of each word into the reply ------
            with m.State("RD_AR"):
                m.d.comb += dram.arvalid.eq(cnt != 0)
                with m.If(cnt == 0):
                    m.next = "ACT_END"
                with m.Elif(dram.arready):
                    m.next = "RD_R"
            with m.State("RD_R"):
                with m.If(dram.rvalid & e_ready):
                    m.d.comb += [e_valid.eq(1), e_feed.eq(1), e_byte.eq(_byte(m, dram.rdata, lane))]
                    m.d.sync += [addr[:AW].eq(addr[:AW] + 1), cnt.eq(cnt - 1)]
                    with m.If((lane == LANES - 1) | (cnt == 1)):
                        m.d.comb += dram.rready.eq(1)
                        with m.If(dram.rresp != 0):
                            m.d.sync += axerr.eq(1)
                        m.next = "RD_AR"

            # -- WRITE_DRAM: the request's bytes gathered into words, written with strobes --------
            with m.State("WD_FETCH"):
                with m.If(rptr == flen - 4):
                    m.d.sync += [status.eq(OK), kind.eq(_NONE)]
                    m.next = "ACT_END"
                with m.Else():
                    m.next = "WD_DATA"
            with m.State("WD_DATA"):
                with m.Switch(lane):
                    for i in range(LANES):
                        with m.Case(i):
                            m.d.sync += [wbuf[8 * i : 8 * i + 8].eq(req_r.data), wstb[i].eq(1)]
                m.d.sync += rptr.eq(rptr + 1)
                with m.If((lane == LANES - 1) | (rptr == flen - 5)):
                    m.d.sync += [aw_done.eq(0), w_done.eq(0)]
                    m.next = "WD_AW"
                with m.Else():
                    m.d.sync += addr[:AW].eq(addr[:AW] + 1)
                    m.next = "WD_FETCH"
            with m.State("WD_AW"):
                with m.If(address_and_data(m, dram, aw_done, w_done)):
                    m.next = "WD_B"
            with m.State("WD_B"):
                m.d.comb += dram.bready.eq(1)
                with m.If(dram.bvalid):
                    with m.If(dram.bresp != 0):
                        m.d.sync += axerr.eq(1)
                    m.d.sync += [addr[:AW].eq(addr[:AW] + 1), wstb.eq(0)]
                    m.next = "WD_FETCH"

            # -- WAIT: STATUS first, then polled every 16 cycles while counting, then once more ---
            with m.State("W_AR"):
                m.d.comb += regs.arvalid.eq(1)
                with m.If(regs.arready):
                    m.next = "W_R"
            with m.State("W_R"):
                m.d.comb += regs.rready.eq(1)
                with m.If(regs.rvalid):
                    with m.If(regs.rresp != 0):
                        m.d.sync += axerr.eq(1)
                    with m.If(w_init):  # the core's state before the wait
                        m.d.sync += [w_init.eq(0), running.eq(is_running), wcnt.eq(0), irq_prev.eq(self.irq)]
                        with m.If(~is_running & no_limit):
                            m.d.sync += w_fin.eq(1)
                            m.next = "W_AR"
                        with m.Else():
                            m.d.sync += counting.eq(1)
                            m.next = "W_GAP"
                    with m.Elif(w_fin | ~is_running):  # the state after the wait
                        m.d.sync += [
                            counting.eq(0),
                            finished.eq(~is_running & (running | no_limit)),
                            status.eq(OK),
                            kind.eq(_WAIT),
                        ]
                        m.next = "ACT_END"
                    with m.Elif(~counting):
                        m.d.sync += w_fin.eq(1)
                        m.next = "W_AR"
                    with m.Else():
                        m.next = "W_GAP"
            with m.State("W_GAP"):
                with m.If(~counting):
                    m.d.sync += w_fin.eq(1)
                    m.next = "W_AR"
                with m.Elif(running & (wcnt[:4] == 15)):
                    m.next = "W_AR"

            # -- send: the stored (encoded) reply, then the delimiter -----------------------------
            with m.State("SEND_A"):
                m.d.comb += rep_r.addr.eq(sptr)
                with m.If(sptr == rlen):
                    m.next = "SEND_END"
                with m.Else():
                    m.next = "SEND_B"
            with m.State("SEND_B"):
                m.d.comb += [rep_r.addr.eq(sptr), utx.stream.valid.eq(1), utx.stream.payload.eq(rep_r.data)]
                with m.If(utx.stream.ready):
                    m.d.sync += sptr.eq(sptr + 1)
                    m.next = "SEND_A"
            with m.State("SEND_END"):
                m.d.comb += [utx.stream.valid.eq(1), utx.stream.payload.eq(0)]
                with m.If(utx.stream.ready):
                    m.next = "IDLE"

            with m.State("RESEND"):  # the constant RESEND frame (sequence 0), delimiter included
                m.d.comb += utx.stream.valid.eq(1)
                with m.Switch(k):
                    for i, b in enumerate(resend):
                        with m.Case(i):
                            m.d.comb += utx.stream.payload.eq(b)
                with m.If(utx.stream.ready):
                    m.d.sync += k.eq(k + 1)
                    with m.If(k == len(resend) - 1):
                        m.next = "IDLE"

        m.d.comb += busy.eq(~fsm.ongoing("IDLE"))
        return m


def _byte(m, value, index):
    """Byte `index` of `value`: a plain byte multiplexer (a variable shift costs far more)."""
    out = Signal(8)
    with m.Switch(index):
        for i in range(min((len(value) + 7) // 8, 1 << len(index))):
            with m.Case(i):
                m.d.comb += out.eq(value[8 * i : 8 * i + 8])
    return out


def _beyond(addr, span, size: int, max_span: int):
    """addr + span > size, for span <= max_span (larger spans are refused before): for a power-of-two
    size an adder as wide as max_span, as only an address in the last max_span bytes can pass it."""
    s = size.bit_length() - 1
    w = max_span.bit_length()  # span < 2^w
    if size != 1 << s or w > s or s >= len(addr):
        return (addr + span) > size
    hi = addr[s:]
    at_size = (hi == 1) & (addr[:s] == 0)
    return Mux(
        hi != 0,
        ~at_size | (span != 0),
        (addr[w:s] == (1 << (s - w)) - 1) & ((addr[:w] + span[: w + 1]) > (1 << w)),
    )

"""Vector unit: VMAP (requantise/rescale/clamp), VADD, VMUL (product of two tensors, one may be a
broadcast row), POOL and VLUT (a 256-entry int8 table) on `vector_lanes` elements a cycle.

Operands are read as two consecutive words (scratchpad lane words, or accumulator words) so that any
element-aligned group of lanes can be fetched at once; results are written as two lane words for the
same reason. The arithmetic is exactly `sim/golden/kernels.py`: 64-bit products, rounding right shift (ties
up), zero points and a clamp.

int16 operands and destinations (`*_i16`, not VLUT) keep this byte machinery at the same rate: a
step takes vector_lanes elements whatever their type, so it reads and writes up to 2 *
vector_lanes bytes of an int16 operand (still two lane words: the configuration keeps 2 *
vector_lanes <= lanes), and lane l takes bytes 2l, 2l + 1 of an int16 one. The lanes'
arithmetic is as wide as int16 needs (17-bit operands less their zero points, a 17 x 17 VMUL
product, a 32-bit POOL window sum, a 16-bit clamp to lo * 256 .. hi * 256 + 255 for an int16
destination); its stages are unchanged.

The unit is a pipeline, so that no cycle holds more than one multiplier or one wide carry chain:

  setup (2 cycles after `go`): the instruction's constant strides and products (POOL's row, pixel
         and window steps, kh * kw * zp_in: one multiplier at `go`, the rest shifted adds over
         8-bit fields); its last cycle loads the first step into S0;
  S0  asks the scratchpad for the step's operands until they are all granted. The step's operand
      words, their requests and its control are registers, worked out the cycle before from the
      loop registers, which run one step ahead: address registers that advance by those steps (no
      multiplier). When the operands are granted the next step's values are loaded and the loops
      advance, so the grant only enables registers and every request starts from flip-flops;
  S1  the operand words arrive and are aligned to the lanes;
  S2  zero points are subtracted (VMUL: and the operands multiplied, up to 17 x 17 bits), POOL
      accumulates its window;
  S3  partial products (no multiplier wider than 34 x 17 bits), S3b their sum (and the step's
      shift amounts, registered);
  S4  the right shift (a barrel shift by a registered amount), keeping the rounding bit;
  S5  the rounding bit and the output zero point in one add, and the clamp, into registers;
  S6  the results are written (the scratchpad grants the vector unit's writes first, so they
      never wait and the pipeline never stalls after S0).

A per-column VMAP (`per_col`) first walks parameter steps through S0-S2 that copy its multipliers
and shifts into two memories of the unit (one entry: vector_lanes columns); its element steps read
the multipliers of their columns at S1 (they arrive at S2 and are registered there, used at S3) and
the shifts at S3 (clamped and registered at S3b, used at S4), so that no stage multiplies or shifts
by a block RAM's output.

VLUT first walks 256 / vector_lanes table steps through S0-S2 that copy its table into a small
memory of the unit (one read port per lane), then its element steps look their bytes up in it at S2
(the read is registered: the byte arrives at S3) and bypass the arithmetic.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from npu.config import NpuConfig
from npu.isa import INSTR_BITS, LUT_BYTES, MAX_SHIFT, OFFSETS, PER_COL_MAX, Opcode

from .common import exec_signature, log2, low_bytes_mask, min_, shift_add, view, word_index
from .spad import gather

#: cycles from `go` to the first operand request, and from a step's operands to its write
SETUP_CYCLES = 2
WRITE_STAGE = 7
AW = 22  # on-chip byte addresses (every checked instruction stays below ACC_BASE + acc_bytes)
# VLUT's element loop reads VMAP's views of these fields: they sit at the same bits
assert all(OFFSETS[Opcode.VLUT][f] == OFFSETS[Opcode.VMAP][f]
           for f in ("src", "dst", "rows", "cols", "src_stride", "dst_stride"))  # fmt: skip
assert OFFSETS[Opcode.VMUL]["a"] == OFFSETS[Opcode.VMAP]["src"]  # the row register starts from either


def shift_keep_round(v, shift):
    """The first half of a rounding right shift: Cat(r, v >> shift), r the rounding bit (bit
    shift - 1 of v, 0 for shift == 0). (v + 2**(shift-1)) >> shift is (v >> shift) + r, so the
    rounding needs no add here: it joins the next stage's (`add_round`)."""
    return Cat(Const(0, 1), v).as_signed() >> shift


def add_round(t, z):
    """(t >> 1) + z + t[0] for t from `shift_keep_round`: t[0] enters the add as its carry in,
    (2q + r + 2z + 1) >> 1 == q + z + r, so the rounding costs no add of its own."""
    return (t + Cat(Const(1, 1), z).as_signed()) >> 1


def clamp_bounds(m: Module, lo, hi, z, name: str) -> tuple[Signal, Signal]:
    """The clamp bounds [lo, hi] of `add_round(t, z)` as bounds of `t` itself: add_round(t, z) < lo
    exactly when t < 2 (lo - z) - 1, and > hi exactly when t > 2 (hi - z). Registered from the
    instruction's fields, so the clamp's compares run beside the add instead of after it (Fmax)."""
    t_lo, t_hi = Signal(signed(20), name=f"{name}_lo"), Signal(signed(20), name=f"{name}_hi")
    m.d.sync += [t_lo.eq(((lo - z) << 1) - 1), t_hi.eq((hi - z) << 1)]
    return t_lo, t_hi


class VectorUnit(wiring.Component):
    def __init__(self, cfg: NpuConfig, a_ports, b_ports, c_ports, w_ports):
        """a_ports, b_ports: two scratchpad read clients (one lane word) each; c_ports: two
        accumulator read clients (one word); w_ports: two scratchpad write clients (one lane word)."""
        self.cfg = cfg
        self.a_ports, self.b_ports, self.c_ports, self.w_ports = a_ports, b_ports, c_ports, w_ports
        super().__init__({"exec": In(exec_signature())})

    def elaborate(self, platform):
        m = Module()
        u = SimpleNamespace()  # what the parts below share: their signals and views
        self._decode(m, u)
        self._setup(m, u)
        self._next_step(m, u)
        self._issue(m, u)
        self._control(m, u)
        self._align(m, u)
        self._lut_table(m, u)
        self._per_col(m, u)
        self._lanes(m, u)
        self._write(m, u)
        self._advance(m, u)
        self._start(m, u)
        return m

    def _decode(self, m: Module, u: SimpleNamespace) -> None:
        """The instruction register, the opcode decoded at `go` and per-column VMAP's phase registers."""
        ins = Signal(INSTR_BITS)
        with m.If(self.exec.go):
            m.d.sync += ins.eq(self.exec.instr)
        fm = view(Opcode.VMAP, ins)
        fa = view(Opcode.VADD, ins)
        fp = view(Opcode.POOL, ins)
        fv = view(Opcode.VMUL, ins)
        active = Signal()
        m.d.comb += self.exec.busy.eq(active)
        # the opcode, decoded at `go` (registers: S0's next-step logic starts from them)
        is_map = Signal()
        is_add = Signal()
        is_pool = Signal()
        is_lut = Signal()
        is_mul = Signal()
        with m.If(self.exec.go):
            m.d.sync += [
                is_mul.eq(self.exec.instr[:4] == int(Opcode.VMUL)),
                is_lut.eq(self.exec.instr[:4] == int(Opcode.VLUT)),
                is_map.eq(self.exec.instr[:4] == int(Opcode.VMAP)),
                is_add.eq(self.exec.instr[:4] == int(Opcode.VADD)),
                is_pool.eq(self.exec.instr[:4] == int(Opcode.POOL)),
            ]
        # per-column VMAP: parameter steps (multipliers, then shifts) before the element steps
        per_col = Signal()
        m.d.comb += per_col.eq(is_map & fm.per_col)
        p_rem = Signal(19)  # bytes of the current parameter phase still to read
        p_mults = Signal()  # the phase: 1 multipliers, 0 shifts
        p_src = Signal(AW)
        in_pre = Signal()  # per_col & (p_rem != 0), kept as a register
        es32 = Signal()
        m.d.comb += es32.eq(is_map & fm.src_type & ~in_pre)

        def pick(name: str):
            return Mux(is_map, getattr(fm, name), Mux(is_add, getattr(fa, name),
                       Mux(is_mul, getattr(fv, name), getattr(fp, name))))  # fmt: skip

        u.fm, u.fa, u.fp, u.fv, u.active, u.is_map, u.is_add = fm, fa, fp, fv, active, is_map, is_add
        u.is_pool, u.is_lut, u.is_mul, u.per_col, u.p_rem = is_pool, is_lut, is_mul, per_col, p_rem
        u.p_mults, u.p_src, u.in_pre, u.es32, u.pick = p_mults, p_src, in_pre, es32, pick

    def _setup(self, m: Module, u: SimpleNamespace) -> None:
        """The setup cycles: the instruction's constant steps and products, the clamp bounds."""
        fm, fa, fp, fv, is_map, is_add, is_pool = u.fm, u.fa, u.fp, u.fv, u.is_map, u.is_add, u.is_pool
        is_mul, pick = u.is_mul, u.pick
        setup = Signal(range(SETUP_CYCLES + 1))
        # int16 operands (registered in the setup, read from S0 on): a (VMAP/POOL src), b, dst; a
        # step takes VL elements of any type (it moves up to 2 VL bytes of an int16 operand)
        a16, b16, d16 = Signal(), Signal(), Signal()
        a16_f = (is_map & fm.src_i16) | (is_mul & fv.a_i16) | (is_add & fa.a_i16) | (is_pool & fp.src_i16)
        b16_f = (is_mul & fv.b_i16) | (is_add & fa.b_i16)
        d16_f = (is_map & fm.dst_i16) | (is_mul & fv.dst_i16) | (is_add & fa.dst_i16) | (is_pool & fp.dst_i16)
        c_src = Signal(17)  # POOL: bytes of an input pixel (C elements of 1 or 2 bytes)
        c_dst = Signal(17)  # POOL: bytes of an output pixel
        lo_b = Signal(signed(16))  # the clamp bounds: lo, hi; lo * 256, hi * 256 + 255 for int16 dst
        hi_b = Signal(signed(16))
        row_c = Signal(AW)  # POOL: in_w * c_src, bytes between input rows (at `go`)
        ox_step = Signal(AW)  # POOL: sw * c_src, between the windows of neighbouring output pixels
        oy_step = Signal(AW)  # POOL: sh * row_c, between the windows of neighbouring output rows
        khkw = Signal(16)
        kzp = Signal(signed(26))  # POOL: kh * kw * zp_in, taken off an average's sum
        mult = Signal(signed(32))  # VMAP / POOL: the multiplier
        # three multipliers: in_w * c_src and sw * c_src at `go`, and one shared by kh * kw and
        # kh * kw * zp_in in the setup cycles; sh * row_c is shifted adds (8 bits of sh). The DSP
        # blocks are the MACs' and the lanes' (docs/boards.md). Addresses are AW bits: the products
        # modulo 2**AW. The steps are ready for the last setup cycle, whose load advances the loops
        # from the first step. `go` only enables registers: as the shared multiplier's operand
        # select it was the 32-MAC ULX3S build's critical path (pause target -> tokens -> go -> DSP)
        go, np_ = self.exec.go, view(Opcode.POOL, self.exec.instr)
        cs_go = np_.channels << np_.src_i16  # c_src of the instruction starting
        sa, sb = Signal(unsigned(16)), Signal(signed(18))
        m.d.comb += [
            sa.eq(Mux(setup == SETUP_CYCLES, fp.kh, khkw)),
            sb.eq(Mux(setup == SETUP_CYCLES, fp.kw, fp.zp_in)),
        ]
        shared = Signal(signed(35))
        m.d.comb += shared.eq(sa * sb)
        with m.If(go):
            m.d.sync += [ox_step.eq(np_.sw * cs_go), row_c.eq(np_.in_w * cs_go)]
        with m.If(setup == SETUP_CYCLES):  # first cycle: single products of fields
            cs = fp.channels << fp.src_i16
            m.d.sync += [
                oy_step.eq(shift_add(fp.sh, row_c, AW)),
                khkw.eq(shared),
                c_src.eq(cs),
                c_dst.eq(fp.channels << fp.dst_i16),
                a16.eq(a16_f),
                b16.eq(b16_f),
                d16.eq(d16_f),
                lo_b.eq(Mux(d16_f, pick("lo") << 8, pick("lo"))),
                hi_b.eq(Mux(d16_f, Cat(Const(0xFF, 8), pick("hi")).as_signed(), pick("hi"))),
            ]
            m.d.sync += mult.eq(Mux(is_map, fm.mult, Mux(is_mul, fv.mult, fp.mult)))
        with m.If(setup == SETUP_CYCLES - 1):  # second cycle: products of those (kzp: read at S2)
            m.d.sync += kzp.eq(shared)
        with m.If(setup != 0):
            m.d.sync += setup.eq(setup - 1)

        u.setup, u.a16, u.b16, u.d16, u.c_src, u.c_dst = setup, a16, b16, d16, c_src, c_dst
        u.lo_b, u.hi_b, u.row_c, u.ox_step, u.oy_step = lo_b, hi_b, row_c, ox_step, oy_step
        u.kzp, u.mult = kzp, mult

    def _next_step(self, m: Module, u: SimpleNamespace) -> None:
        """The loops, the operands and control of the step they point at (issued next), `empty`."""
        cfg = self.cfg
        VL = cfg.vector_lanes
        fm, fa, fp, fv, is_map, is_add, is_lut = u.fm, u.fa, u.fp, u.fv, u.is_map, u.is_add, u.is_lut
        is_mul, p_rem, p_src, in_pre, es32, setup = u.is_mul, u.p_rem, u.p_src, u.in_pre, u.es32, u.setup
        a16, b16, d16 = u.a16, u.b16, u.d16
        t_steps = LUT_BYTES // VL
        t_left = Signal(range(t_steps + 1))  # VLUT: table steps still to issue
        t_src = Signal(AW)  # ... and the address of the next
        in_table = Signal()  # is_lut & (t_left != 0), kept as a register
        i0 = Signal(17)  # VMAP row / POOL oy
        i1 = Signal(17)  # VMAP/VADD element offset (multiple of VL) / POOL ox
        i2 = Signal(17)  # POOL channel offset (multiple of VL)
        ty = Signal(8)
        tx = Signal(8)
        # address registers: VMAP rows; POOL output row's first window, pixel's window, tap row, tap
        row_src = Signal(AW)
        row_b = Signal(AW)  # VMUL's b row
        row_dst = Signal(AW)
        oy_src = Signal(AW)
        win_src = Signal(AW)
        tap_row = Signal(AW)
        tap_src = Signal(AW)
        pix_dst = Signal(AW)

        src = Signal(AW)
        src_b = Signal(AW)
        dst = Signal(AW)
        n = Signal(range(VL + 1))  # valid elements
        last = Signal()  # last step of the instruction
        write = Signal()  # this step writes results
        first_tap = Signal()
        C = fp.channels
        tap_last = Signal()
        m.d.comb += tap_last.eq((ty + 1 >= fp.kh) & (tx + 1 >= fp.kw))
        with m.If(in_table):
            m.d.comb += [src.eq(t_src), n.eq(VL)]  # no write, never the last step
        with m.Elif(in_pre):
            m.d.comb += [src.eq(p_src), n.eq(min_(VL, p_rem))]
        with m.Elif(is_map | is_lut):  # VLUT's element loop is VMAP's (int8 source)
            m.d.comb += [
                src.eq(row_src + Mux(es32, i1 << 2, i1 << a16)),
                dst.eq(row_dst + (i1 << d16)),
                n.eq(min_(VL, fm.cols - i1)),
                last.eq((i0 + 1 >= fm.rows) & (i1 + VL >= fm.cols)),
                write.eq(1),
            ]
        with m.Elif(is_mul):
            m.d.comb += [
                src.eq(row_src + (i1 << a16)),
                src_b.eq(row_b + (i1 << b16)),
                dst.eq(row_dst + (i1 << d16)),
                n.eq(min_(VL, fv.cols - i1)),
                last.eq((i0 + 1 >= fv.rows) & (i1 + VL >= fv.cols)),
                write.eq(1),
            ]
        with m.Elif(is_add):
            m.d.comb += [
                src.eq(fa.a + (i1 << a16)),
                src_b.eq(fa.b + (i1 << b16)),
                dst.eq(fa.dst + (i1 << d16)),
                n.eq(min_(VL, fa.len - i1)),
                last.eq(i1 + VL >= fa.len),
                write.eq(1),
            ]
        with m.Else():
            m.d.comb += [
                src.eq(tap_src + (i2 << a16)),
                dst.eq(pix_dst + (i2 << d16)),
                n.eq(min_(VL, C - i2)),
                write.eq(tap_last),
                first_tap.eq((ty == 0) & (tx == 0)),
                last.eq(tap_last & (i2 + VL >= C) & (i1 + 1 >= fp.out_w) & (i0 + 1 >= fp.out_h)),
            ]

        # an instruction with nothing to do (registered in the first setup cycle: `done` starts from
        # flip-flops, and the core's token and halt logic follows it in the same cycle)
        empty = Signal()
        with m.If(setup == SETUP_CYCLES):
            m.d.sync += empty.eq(
                Mux(
                    is_map | is_lut,
                    (fm.rows == 0) | (fm.cols == 0),
                    Mux(
                        is_mul,
                        (fv.rows == 0) | (fv.cols == 0),
                        Mux(is_add, fa.len == 0, (fp.channels == 0) | (fp.out_h == 0) | (fp.out_w == 0)),
                    ),
                )
            )

        u.src, u.dst, u.t_left, u.t_src, u.in_table, u.i0, u.i1 = src, dst, t_left, t_src, in_table, i0, i1
        u.i2, u.ty, u.tx, u.row_src, u.row_b, u.row_dst = i2, ty, tx, row_src, row_b, row_dst
        u.oy_src, u.win_src, u.tap_row, u.tap_src, u.pix_dst = oy_src, win_src, tap_row, tap_src, pix_dst
        u.src_b, u.n, u.last, u.write, u.first_tap = src_b, n, last, write, first_tap
        u.empty = empty

    def _issue(self, m: Module, u: SimpleNamespace) -> None:
        """S0: the step being issued, from registers, and its operand requests."""
        cfg = self.cfg
        L, ll, W, lw = cfg.lanes, log2(cfg.lanes), cfg.bus_bytes, log2(cfg.bus_bytes)
        is_add, is_mul, p_mults, in_pre, es32 = u.is_add, u.is_mul, u.p_mults, u.in_pre, u.es32
        setup, src, dst, a16, b16, in_table, i1 = u.setup, u.src, u.dst, u.a16, u.b16, u.in_table, u.i1
        src_b, n, last, write, first_tap = u.src_b, u.n, u.last, u.write, u.first_tap
        # The loop registers point at the step after it: `load` (the step's operands all granted,
        # or the last setup cycle, which loads the first step) copies the values above into these
        # registers and advances the loops. So the requests (addresses, `en`) come from flip-flops
        # and the grant only enables registers whose inputs were worked out the cycle before.
        issuing = Signal()  # S0 has steps left to issue
        stepping = Signal()  # ... and the setup is over
        m.d.comb += stepping.eq(issuing & (setup == 0))
        asking = Signal()  # stepping and the instruction is not empty (a register: it gates `en`)
        prime = Signal()  # the last setup cycle: the first step into the issue registers
        m.d.comb += prime.eq(setup == 1)
        # scratchpad operands: lane words g, g+1 (the second only when the group crosses into it)
        ea = a16 & ~in_pre  # the parameter steps read bytes
        reads_a = ~es32
        need_nx = []
        for addr, asks, wide in ((src, reads_a, ea), (src_b, reads_a & (is_add | is_mul), b16)):
            need_nx += [asks, asks & (addr[:ll] + (n << wide) > L)]
        # int32 sources: two accumulator words
        cw = word_index(src, cfg, "acc")
        need_nx += [es32, es32 & (src[:lw] + 4 * n > W)]
        pa, pb = self.a_ports
        pc, pd = self.b_ports
        c0, c1 = self.c_ports
        issue = {  # register: its value for the next step
            "a0": (Signal.like(pa.addr, name="s0_a0"), src[ll:]),
            "a1": (Signal.like(pb.addr, name="s0_a1"), src[ll:] + 1),
            "b0": (Signal.like(pc.addr, name="s0_b0"), src_b[ll:]),
            "b1": (Signal.like(pd.addr, name="s0_b1"), src_b[ll:] + 1),
            "c0": (Signal.like(c0.addr, name="s0_c0"), cw),
            "c1": (Signal.like(c1.addr, name="s0_c1"), cw + 1),
            "off_a": (Signal(ll, name="s0_off_a"), src[:ll]),
            "off_b": (Signal(ll, name="s0_off_b"), src_b[:ll]),
            "off_c": (Signal(lw, name="s0_off_c"), src[:lw]),
            "need": (Signal(6, name="s0_need"), Cat(*need_nx)),
            "n": (Signal.like(n, name="s0_n"), n),
            "last": (Signal(name="s0_last"), last),
            "write": (Signal(name="s0_write"), write),
            "first_tap": (Signal(name="s0_first_tap"), first_tap),
            "dst": (Signal.like(dst, name="s0_dst"), dst),
            "table": (Signal(name="s0_table"), in_table),
            "pm": (Signal(name="s0_pm"), in_pre & p_mults),
            "ps": (Signal(name="s0_ps"), in_pre & ~p_mults),
            "col": (Signal.like(i1, name="s0_col"), i1),
        }
        cur = {k: r for k, (r, _) in issue.items()}
        m.d.comb += [
            pa.addr.eq(cur["a0"]),
            pb.addr.eq(cur["a1"]),
            pc.addr.eq(cur["b0"]),
            pd.addr.eq(cur["b1"]),
            c0.addr.eq(cur["c0"]),
            c1.addr.eq(cur["c1"]),
        ]
        ports = [pa, pb, pc, pd, c0, c1]
        step_done, words = gather(m, ports, [cur["need"][r] & asking for r in range(6)], asking)
        load = Signal()
        m.d.comb += load.eq(step_done | prime)
        with m.If(load):
            m.d.sync += [r.eq(v) for r, v in issue.values()]

        u.load, u.issuing, u.stepping, u.asking, u.prime = load, issuing, stepping, asking, prime
        u.words, u.cur, u.step_done = words, cur, step_done

    def _control(self, m: Module, u: SimpleNamespace) -> None:
        """The step's control down the pipeline: its valid flag and control fields at every stage."""
        cur, step_done = u.cur, u.step_done
        S = WRITE_STAGE
        valid = [step_done] + [Signal(name=f"v{s}") for s in range(1, S + 1)]
        ctl = {
            k: [cur[k]] + [Signal.like(cur[k], name=f"{k}{s}") for s in range(1, S + 1)]
            for k in ("n", "last", "write", "first_tap", "dst", "table", "pm", "ps", "col")
        }
        for s in range(1, S + 1):
            m.d.sync += valid[s].eq(valid[s - 1])
            for sigs in ctl.values():
                m.d.sync += sigs[s].eq(sigs[s - 1])

        u.valid, u.ctl = valid, ctl

    def _align(self, m: Module, u: SimpleNamespace) -> None:
        """S1: the operand words, aligned to the lanes."""
        cfg = self.cfg
        VL, ll, lw = cfg.vector_lanes, log2(cfg.lanes), log2(cfg.bus_bytes)
        words, cur = u.words, u.cur
        off_a = Signal(ll)
        off_b = Signal(ll)
        off_c = Signal(lw)
        m.d.sync += [off_a.eq(cur["off_a"]), off_b.eq(cur["off_b"]), off_c.eq(cur["off_c"])]
        a_bytes = Signal(16 * VL)  # VL elements of int8 or int16
        b_bytes = Signal(16 * VL)
        c_bytes = Signal(32 * VL)
        m.d.sync += [
            a_bytes.eq(Cat(words[0], words[1]) >> (off_a * 8)),
            b_bytes.eq(Cat(words[2], words[3]) >> (off_b * 8)),
            c_bytes.eq(Cat(words[4], words[5]) >> (off_c * 8)),
        ]
        u.a_bytes, u.b_bytes, u.c_bytes = a_bytes, b_bytes, c_bytes

    def _lut_table(self, m: Module, u: SimpleNamespace) -> None:
        """VLUT's table: written by the table steps at S2, read by the element steps at S2."""
        cfg = self.cfg
        VL, t_steps = cfg.vector_lanes, LUT_BYTES // cfg.vector_lanes
        valid, ctl, a_bytes = u.valid, u.ctl, u.a_bytes
        lut = m.submodules.lut = Memory(shape=unsigned(8 * VL), depth=t_steps, init=[])
        t_wr = lut.write_port()
        t_addr = Signal(range(t_steps))
        m.d.comb += [t_wr.addr.eq(t_addr), t_wr.data.eq(a_bytes), t_wr.en.eq(valid[2] & ctl["table"][2])]
        with m.If(t_wr.en):
            m.d.sync += t_addr.eq(t_addr + 1)
        with m.If(self.exec.go):
            m.d.sync += t_addr.eq(0)

        u.lut = lut

    def _per_col(self, m: Module, u: SimpleNamespace) -> None:
        """Per-column VMAP's multiplier and shift memories: written by the parameter steps at S2."""
        cfg = self.cfg
        VL = cfg.vector_lanes
        valid, ctl, a_bytes = u.valid, u.ctl, u.a_bytes
        vw = log2(VL)
        depth = PER_COL_MAX // VL
        mults = m.submodules.mults = Memory(shape=unsigned(32 * VL), depth=depth, init=[])
        shifts = m.submodules.shifts = Memory(shape=unsigned(8 * VL), depth=depth, init=[])
        m_wr = mults.write_port(granularity=8)
        s_wr = shifts.write_port()
        m_step = Signal(range(4 * depth + 1))  # multiplier steps written (VL bytes each)
        s_step = Signal(range(depth + 1))
        quarter = m_step[:2]  # an entry holds 4 * VL bytes: four steps
        m.d.comb += [
            m_wr.addr.eq(m_step[2:]),
            m_wr.data.eq(a_bytes << (quarter * 8 * VL)),
            m_wr.en.eq(Mux(valid[2] & ctl["pm"][2], Const((1 << VL) - 1, 4 * VL) << (quarter * VL), 0)),
            s_wr.addr.eq(s_step),
            s_wr.data.eq(a_bytes),
            s_wr.en.eq(valid[2] & ctl["ps"][2]),
        ]
        with m.If(valid[2] & ctl["pm"][2]):
            m.d.sync += m_step.eq(m_step + 1)
        with m.If(valid[2] & ctl["ps"][2]):
            m.d.sync += s_step.eq(s_step + 1)
        with m.If(self.exec.go):
            m.d.sync += [m_step.eq(0), s_step.eq(0)]
        # element steps: their columns' multipliers arrive at S2 (registered there, used at S3),
        # their shifts at S3b (registered there): S3 and S4 do not start from a block RAM's read.
        # The multipliers' last write (S2 of the last multiplier step) comes at least a shift step
        # before the first element step's read at S1.
        m_rd = mults.read_port()
        s_rd = shifts.read_port()
        m.d.comb += [m_rd.addr.eq(ctl["col"][1][vw:]), s_rd.addr.eq(ctl["col"][3][vw:])]
        u.m_rd, u.s_rd = m_rd, s_rd

    def _lanes(self, m: Module, u: SimpleNamespace) -> None:
        """S2..S5, per lane (S3b a stage of its own): the arithmetic, VLUT's look-up, the results."""
        cfg = self.cfg
        VL, S = cfg.vector_lanes, WRITE_STAGE
        tw = log2(VL)
        fm, fa, fp, fv, is_map, is_add, is_pool = u.fm, u.fa, u.fp, u.fv, u.is_map, u.is_add, u.is_pool
        is_lut, is_mul, per_col, pick, a16, b16 = u.is_lut, u.is_mul, u.per_col, u.pick, u.a16, u.b16
        lo_b, hi_b, kzp, mult, valid, ctl, a_bytes = u.lo_b, u.hi_b, u.kzp, u.mult, u.valid, u.ctl, u.a_bytes
        b_bytes, c_bytes, lut, m_rd, s_rd = u.b_bytes, u.c_bytes, u.lut, u.m_rd, u.s_rd
        shift, zp_out = pick("shift"), pick("zp_out")
        t_lo, t_hi = clamp_bounds(m, lo_b, hi_b, zp_out, "clamp")
        results = []
        for l in range(VL):
            xa8 = a_bytes[8 * l : 8 * l + 8].as_signed()
            xb8 = b_bytes[8 * l : 8 * l + 8].as_signed()
            x32 = c_bytes[32 * l : 32 * l + 32].as_signed()
            # the lane's element: int8 byte l, or int16 bytes 2l, 2l + 1
            ya = Mux(a16, a_bytes[16 * l : 16 * l + 16].as_signed(), xa8)
            yb = Mux(b16, b_bytes[16 * l : 16 * l + 16].as_signed(), xb8)
            # S2: operands less their zero points; POOL's window sum (less kh * kw * zp_in) or maximum
            x = Signal(signed(34), name=f"x{l}")  # VMAP / POOL average: the multiplicand
            xa = Signal(signed(17), name=f"xa{l}")  # VADD
            xb = Signal(signed(17), name=f"xb{l}")
            pmax = Signal(signed(16), name=f"pmax{l}")  # the window's maximum so far
            psum = Signal(signed(32), name=f"psum{l}")  # the window's sum so far (|sum| < 2**31)
            first = ctl["first_tap"][2]
            new_sum = Mux(first, 0, psum) + ya
            with m.If(valid[2] & is_pool):
                m.d.sync += [psum.eq(new_sum), pmax.eq(Mux(first | (ya > pmax), ya, pmax))]
            m.d.sync += [
                x.eq(
                    Mux(
                        is_map,
                        Mux(fm.src_type, x32, ya - fm.zp_in),
                        Mux(is_mul, (ya - fv.zp_a) * (yb - fv.zp_b), new_sum - kzp),
                    )
                ),  # fmt: skip
                xa.eq(ya - fa.zp_a),
                xb.eq(yb - fa.zp_b),
            ]
            # S3: four 18 x 17-bit partial products (one DSP block each, registered at its output so
            # that no path runs from a DSP through an adder), shared by VMAP/POOL/VMUL (x * mult:
            # x = xh * 2^17 + xl, mult = mh * 2^16 + ml) and VADD (xa * mult_a + xb * mult_b, each
            # multiplier split the same way)
            mult_l = Signal(signed(32), name=f"mult{l}")
            m_lane = m_rd.data[32 * l : 32 * l + 32]  # per column: a step's columns are one entry
            m.d.sync += mult_l.eq(Mux(per_col, m_lane, mult))
            xl, xh = x[:17], x[17:34].as_signed()
            ml, mh = mult_l[:16], mult_l[16:].as_signed()
            operands = [  # (VMAP's, VADD's): q0 + (q1 << 17 | q1) + (q2 << 16) + (q3 << 33 | q3 << 16)
                ((xl, ml), (xa, fa.mult_a[:16])),
                ((xh, ml), (xb, fa.mult_b[:16])),
                ((xl, mh), (xa, fa.mult_a[16:].as_signed())),
                ((xh, mh), (xb, fa.mult_b[16:].as_signed())),
            ]
            q = []
            for k, ((a_map, b_map), (a_add, b_add)) in enumerate(operands):
                a, b = Signal(signed(18), name=f"qa{k}_{l}"), Signal(signed(17), name=f"qb{k}_{l}")
                qk = Signal(signed(35), name=f"q{k}_{l}")
                m.d.comb += [a.eq(Mux(is_add, a_add, a_map)), b.eq(Mux(is_add, b_add, b_map))]
                m.d.sync += qk.eq(a * b)
                q.append(qk)
            # S3b: the product; the lane's shift (its column's, clamped, or the instruction's)
            prod = Signal(signed(68), name=f"prod{l}")
            m.d.sync += prod.eq(
                q[0] + Mux(is_add, q[1], q[1] << 17) + (q[2] << 16) + Mux(is_add, q[3] << 16, q[3] << 33)
            )
            s_raw = s_rd.data[8 * l : 8 * l + 6]
            shift_l = Signal(6, name=f"shift{l}")
            m.d.sync += shift_l.eq(Mux(per_col, Mux(s_raw > MAX_SHIFT, MAX_SHIFT, s_raw), shift))
            # S4: the shift alone (its rounding bit below it, added at S5)
            shifted = Signal(signed(69), name=f"shifted{l}")
            m.d.sync += shifted.eq(shift_keep_round(prod, shift_l))
            # S5: the rounding bit and the output zero point (POOL max: the window's maximum as
            # is) and the clamp
            pmax_d = [pmax]
            for k in range(3, S - 1):
                d = Signal(signed(16), name=f"pmax{k + 1}_{l}")
                m.d.sync += d.eq(pmax_d[-1])
                pmax_d.append(d)
            pmax_w = pmax_d[-1]
            # S5's value, and whether it is below or above the clamp bounds (int16 bounds, an int8
            # destination's in the int8 range): POOL max compares its maximum, the others their
            # shifted product before the add (clamp_bounds)
            pool_max = is_pool & ~fp.mode
            val = Signal(signed(69), name=f"val{l}")
            below, above = Signal(name=f"below{l}"), Signal(name=f"above{l}")
            m.d.comb += [
                val.eq(Mux(pool_max, pmax_w, add_round(shifted, zp_out))),
                below.eq(Mux(pool_max, pmax_w < lo_b, shifted < t_lo)),
                above.eq(Mux(pool_max, pmax_w > hi_b, shifted > t_hi)),
            ]
            # VLUT: the lane's byte (x + 128) picks a table word at S2 and its byte at S3
            idx = Signal(8, name=f"idx{l}")
            m.d.comb += idx.eq(xa8.as_unsigned() ^ 0x80)
            rd = lut.read_port()
            m.d.comb += rd.addr.eq(idx[tw:])
            sel = Signal(max(1, tw), name=f"sel{l}")
            m.d.sync += sel.eq(idx[:tw] if tw else 0)
            looked = [Signal(signed(8), name=f"lut3_{l}")]
            m.d.comb += looked[0].eq(rd.data.word_select(sel, 8) if tw else rd.data)
            for k in range(3, S - 1):
                d = Signal(signed(8), name=f"lut{k + 1}_{l}")
                m.d.sync += d.eq(looked[-1])
                looked.append(d)
            # registered: the clamp's compares and the write's byte placement take a cycle each
            result = Signal(signed(16), name=f"result{l}")
            clamped = Mux(below, lo_b, Mux(above, hi_b, val[:16]))
            m.d.sync += result.eq(Mux(is_lut, looked[-1], clamped))
            results.append(result)

        u.results = results

    def _write(self, m: Module, u: SimpleNamespace) -> None:
        """S6: the results' write."""
        cfg = self.cfg
        VL, L, ll, S = cfg.vector_lanes, cfg.lanes, log2(cfg.lanes), WRITE_STAGE
        d16, valid, results, ctl = u.d16, u.valid, u.results, u.ctl
        # S6 (cycle WRITE_STAGE after the operands): two-lane-word write of n elements at dst, VL
        # int8 or int16 results (at most 2 VL <= L bytes)
        n_w, dst_w = ctl["n"][S], ctl["dst"][S]
        do_write = Signal()
        m.d.comb += do_write.eq(valid[S] & ctl["write"][S] & (n_w != 0))
        out = Signal(16 * VL)
        m.d.comb += out.eq(Mux(d16, Cat(*results), Cat(*[r[:8] for r in results])))
        wdata = Signal(16 * L)
        m.d.comb += wdata.eq(out << (dst_w[:ll] * 8))
        be = Signal(2 * L)
        m.d.comb += be.eq(low_bytes_mask(n_w << d16, 2 * VL) << dst_w[:ll])
        w0, w1 = self.w_ports
        m.d.comb += [
            w0.addr.eq(dst_w[ll:]),
            w1.addr.eq(dst_w[ll:] + 1),
            w0.data.eq(wdata[: 8 * L]),
            w1.data.eq(wdata[8 * L :]),
            w0.be.eq(be[:L]),
            w1.be.eq(be[L:]),
            w0.en.eq(do_write & be[:L].any()),
            w1.en.eq(do_write & be[L:].any()),
        ]

    def _advance(self, m: Module, u: SimpleNamespace) -> None:
        """The end of issue, `done`, and the loops' advance with each load."""
        cfg = self.cfg
        VL, S = cfg.vector_lanes, WRITE_STAGE
        fm, fp, fv, active, is_map, is_add, is_lut = u.fm, u.fp, u.fv, u.active, u.is_map, u.is_add, u.is_lut
        is_mul, p_rem, p_mults, p_src, in_pre = u.is_mul, u.p_rem, u.p_mults, u.p_src, u.in_pre
        c_src, c_dst, row_c, ox_step, oy_step = u.c_src, u.c_dst, u.row_c, u.ox_step, u.oy_step
        t_left, t_src, in_table, i0, i1, i2, ty = u.t_left, u.t_src, u.in_table, u.i0, u.i1, u.i2, u.ty
        tx, row_src, row_b, row_dst, oy_src = u.tx, u.row_src, u.row_b, u.row_dst, u.oy_src
        win_src, tap_row, tap_src, pix_dst, valid = u.win_src, u.tap_row, u.tap_src, u.pix_dst, u.valid
        empty, load, issuing, stepping, asking = u.empty, u.load, u.issuing, u.stepping, u.asking
        prime, cur, step_done, ctl = u.prime, u.cur, u.step_done, u.ctl
        # the loops advance with each load (past the last step too: nothing issues it)
        with m.If(stepping & (empty | (step_done & cur["last"]))):
            m.d.sync += issuing.eq(0)
        with m.If(prime):
            m.d.sync += asking.eq(~empty)
        with m.Elif(step_done & cur["last"]):
            m.d.sync += asking.eq(0)
        finished = Signal()
        m.d.comb += finished.eq(active & ((stepping & empty) | (valid[S] & ctl["last"][S])))
        m.d.comb += self.exec.done.eq(finished)
        with m.If(load):
            with m.If(in_table):
                m.d.sync += [t_left.eq(t_left - 1), t_src.eq(t_src + VL)]
                with m.If(t_left == 1):
                    m.d.sync += in_table.eq(0)
            with m.Elif(in_pre):
                with m.If(p_rem > VL):
                    m.d.sync += [p_rem.eq(p_rem - VL), p_src.eq(p_src + VL)]
                with m.Elif(p_mults):  # the multipliers are read: the shifts next
                    m.d.sync += [p_mults.eq(0), p_rem.eq(fm.cols), p_src.eq(fm.shifts)]
                with m.Else():
                    m.d.sync += [p_rem.eq(0), in_pre.eq(0)]
            with m.Elif(is_mul):
                with m.If(i1 + VL >= fv.cols):
                    m.d.sync += [i1.eq(0), i0.eq(i0 + 1), row_src.eq(row_src + fv.a_stride)]
                    m.d.sync += [row_b.eq(row_b + fv.b_stride), row_dst.eq(row_dst + fv.dst_stride)]
                with m.Else():
                    m.d.sync += i1.eq(i1 + VL)
            with m.Elif(is_map | is_lut):
                with m.If(i1 + VL >= fm.cols):
                    m.d.sync += [i1.eq(0), i0.eq(i0 + 1), row_src.eq(row_src + fm.src_stride),
                                 row_dst.eq(row_dst + fm.dst_stride)]  # fmt: skip
                with m.Else():
                    m.d.sync += i1.eq(i1 + VL)
            with m.Elif(is_add):
                m.d.sync += i1.eq(i1 + VL)
            with m.Else():
                with m.If(tx + 1 < fp.kw):
                    m.d.sync += [tx.eq(tx + 1), tap_src.eq(tap_src + c_src)]
                with m.Elif(ty + 1 < fp.kh):
                    m.d.sync += [
                        tx.eq(0),
                        ty.eq(ty + 1),
                        tap_row.eq(tap_row + row_c),
                        tap_src.eq(tap_row + row_c),
                    ]
                with m.Else():
                    m.d.sync += [tx.eq(0), ty.eq(0), tap_row.eq(win_src), tap_src.eq(win_src)]
                    with m.If(i2 + VL < fp.channels):
                        m.d.sync += i2.eq(i2 + VL)
                    with m.Else():
                        m.d.sync += [i2.eq(0), pix_dst.eq(pix_dst + c_dst)]
                        with m.If(i1 + 1 < fp.out_w):
                            nxt = win_src + ox_step
                            m.d.sync += [i1.eq(i1 + 1), win_src.eq(nxt), tap_row.eq(nxt), tap_src.eq(nxt)]
                        with m.Else():
                            nxt = oy_src + oy_step
                            m.d.sync += [i1.eq(0), i0.eq(i0 + 1), oy_src.eq(nxt), win_src.eq(nxt),
                                         tap_row.eq(nxt), tap_src.eq(nxt)]  # fmt: skip

        u.finished = finished

    def _start(self, m: Module, u: SimpleNamespace) -> None:
        """`active`, and the loops' start at `go`."""
        cfg = self.cfg
        t_steps = LUT_BYTES // cfg.vector_lanes
        active, p_rem, p_mults, p_src, in_pre = u.active, u.p_rem, u.p_mults, u.p_src, u.in_pre
        setup, t_left, t_src, in_table, i0 = u.setup, u.t_left, u.t_src, u.in_table, u.i0
        i1, i2, ty, tx, row_src, row_b, row_dst = u.i1, u.i2, u.ty, u.tx, u.row_src, u.row_b, u.row_dst
        oy_src, win_src, tap_row, tap_src, pix_dst = u.oy_src, u.win_src, u.tap_row, u.tap_src, u.pix_dst
        issuing, asking, finished = u.issuing, u.asking, u.finished
        with m.If(finished):
            m.d.sync += active.eq(0)
        with m.If(self.exec.go):
            nf = view(Opcode.VMAP, self.exec.instr)
            np_ = view(Opcode.POOL, self.exec.instr)
            nl = view(Opcode.VLUT, self.exec.instr)
            nv = view(Opcode.VMUL, self.exec.instr)
            go_mul = self.exec.instr[:4] == int(Opcode.VMUL)
            go_lut = self.exec.instr[:4] == int(Opcode.VLUT)
            go_pc = (self.exec.instr[:4] == int(Opcode.VMAP)) & nf.per_col
            m.d.sync += [
                t_left.eq(Mux(go_lut, t_steps, 0)),
                in_table.eq(go_lut),
                p_rem.eq(Mux(go_pc, nf.cols << 2, 0)),
                in_pre.eq(go_pc & (nf.cols != 0)),
                p_mults.eq(1),
                p_src.eq(nf.mults),
                t_src.eq(nl.table),
                active.eq(1),
                issuing.eq(1),
                asking.eq(0),
                setup.eq(SETUP_CYCLES),
                i0.eq(0),
                i1.eq(0),
                i2.eq(0),
                ty.eq(0),
                tx.eq(0),
                row_src.eq(nf.src),
                row_b.eq(nv.b),
                row_dst.eq(Mux(go_mul, nv.dst, nf.dst)),
                oy_src.eq(np_.src),
                win_src.eq(np_.src),
                tap_row.eq(np_.src),
                tap_src.eq(np_.src),
                pix_dst.eq(np_.dst),
            ]

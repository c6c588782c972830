"""Vector unit: VMAP (requantise/rescale/clamp), VADD and POOL on `vector_lanes` elements a cycle.

Operands are read as two consecutive words (scratchpad lane words, or accumulator words) so that any
element-aligned group of lanes can be fetched at once; results are written as two lane words for the
same reason. Stage 0 walks the loops and asks the scratchpad for the step's operands until they are
all granted (operands that arrive early wait in registers); the cycle after, stage 1 computes and
writes the step's results (the scratchpad grants the vector unit's writes first, so they never wait). The
arithmetic is exactly `sim/kernels.py`: 64-bit products, rounding right shift (ties up), zero
points and an int8 clamp.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from npu.config import NpuConfig
from npu.isa import INSTR_BITS, Opcode

from .common import exec_signature, log2, low_bytes_mask, min_, view, word_index
from .spad import gather


def rsr(m: Module, v, shift, name: str):
    """Rounding arithmetic right shift: (v + 2**(shift-1)) >> shift, v for shift == 0."""
    r = Signal(signed(72), name=name)
    rnd = Signal(64, name=f"{name}_rnd")
    m.d.comb += rnd.eq((Const(1, 64) << shift)[:64] >> 1)  # 2**(shift-1), or 0 when shift == 0
    acc = Signal(signed(74), name=f"{name}_sum")
    m.d.comb += acc.eq(v + rnd)
    m.d.comb += r.eq(acc >> shift)
    return r


def clamp8(m: Module, v, lo, hi, name: str):
    y = Signal(signed(8), name=name)
    m.d.comb += y.eq(Mux(v < lo, lo, Mux(v > hi, hi, v)))
    return y


class VectorUnit(wiring.Component):
    def __init__(self, cfg: NpuConfig, a_ports, b_ports, c_ports, w_ports):
        """a_ports, b_ports: two scratchpad read clients (one lane word) each; c_ports: two
        accumulator read clients (one word); w_ports: two scratchpad write clients (one lane word)."""
        self.cfg = cfg
        self.a_ports, self.b_ports, self.c_ports, self.w_ports = a_ports, b_ports, c_ports, w_ports
        super().__init__({"exec": In(exec_signature())})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        VL = cfg.vector_lanes
        ins = Signal(INSTR_BITS)
        with m.If(self.exec.go):
            m.d.sync += ins.eq(self.exec.instr)
        op = ins[:4]
        fm = view(Opcode.VMAP, ins)
        fa = view(Opcode.VADD, ins)
        fp = view(Opcode.POOL, ins)
        active = Signal()
        m.d.comb += self.exec.busy.eq(active)
        is_map = op == int(Opcode.VMAP)
        is_add = op == int(Opcode.VADD)
        is_pool = op == int(Opcode.POOL)

        # loop state: VMAP (row, col group); VADD (group); POOL (oy, ox, group, ty, tx)
        i0 = Signal(17)  # VMAP row / POOL oy
        i1 = Signal(17)  # VMAP/VADD element offset (multiple of VL) / POOL ox
        i2 = Signal(17)  # POOL channel offset (multiple of VL)
        ty = Signal(8)
        tx = Signal(8)
        pool_acc = [Signal(signed(32), name=f"pacc{l}") for l in range(VL)]

        # addresses of this step
        src = Signal(40)
        src_b = Signal(40)
        dst = Signal(40)
        n = Signal(range(VL + 1))  # valid elements
        last = Signal()  # last step of the instruction
        write = Signal()  # this step writes results
        first_tap = Signal()
        es32 = Signal()
        m.d.comb += es32.eq(is_map & fm.src_type)
        with m.If(is_map):
            m.d.comb += [
                src.eq(fm.src + i0 * fm.src_stride + Mux(es32, i1 << 2, i1)),
                dst.eq(fm.dst + i0 * fm.dst_stride + i1),
                n.eq(min_(VL, fm.cols - i1)),
                last.eq((i0 + 1 >= fm.rows) & (i1 + VL >= fm.cols)),
                write.eq(1),
            ]
        with m.Elif(is_add):
            m.d.comb += [
                src.eq(fa.a + i1),
                src_b.eq(fa.b + i1),
                dst.eq(fa.dst + i1),
                n.eq(min_(VL, fa.len - i1)),
                last.eq(i1 + VL >= fa.len),
                write.eq(1),
            ]
        with m.Else():
            C = fp.channels
            tap_last = (ty + 1 >= fp.kh) & (tx + 1 >= fp.kw)
            m.d.comb += [
                src.eq(fp.src + ((i0 * fp.sh + ty) * fp.in_w + i1 * fp.sw + tx) * C + i2),
                dst.eq(fp.dst + (i0 * fp.out_w + i1) * C + i2),
                n.eq(min_(VL, C - i2)),
                write.eq(tap_last),
                first_tap.eq((ty == 0) & (tx == 0)),
                last.eq(tap_last & (i2 + VL >= C) & (i1 + 1 >= fp.out_w) & (i0 + 1 >= fp.out_h)),
            ]

        # the step's control, one cycle later (stage 1)
        v1 = Signal()
        n1 = Signal.like(n)
        last1 = Signal()
        write1 = Signal()
        first_tap1 = Signal()
        dst1 = Signal.like(dst)
        m.d.sync += [n1.eq(n), last1.eq(last), write1.eq(write), first_tap1.eq(first_tap), dst1.eq(dst)]

        # an instruction with nothing to do
        empty = Signal()
        m.d.comb += empty.eq(
            Mux(
                is_map,
                (fm.rows == 0) | (fm.cols == 0),
                Mux(is_add, fa.len == 0, (fp.channels == 0) | (fp.out_h == 0) | (fp.out_w == 0)),
            )
        )
        # scratchpad operands: lane words g, g+1 (the second only when the group crosses into it)
        L = cfg.lanes
        ll = log2(L)
        issuing = Signal()  # stage 0 has steps left to issue
        reads_a = Signal()
        m.d.comb += reads_a.eq(issuing & ~empty & ~es32)
        W = cfg.bus_bytes
        lw = log2(W)
        reads_c = Signal()
        m.d.comb += reads_c.eq(issuing & ~empty & es32)
        ports, need = [], []
        for name, addr, asks in (("a", src, reads_a), ("b", src_b, reads_a & is_add)):
            pa, pb = self.a_ports if name == "a" else self.b_ports
            m.d.comb += [pa.addr.eq(addr[ll:]), pb.addr.eq(addr[ll:] + 1)]
            ports += [pa, pb]
            need += [asks, asks & (addr[:ll] + n > L)]
        # int32 sources: two accumulator words
        c0, c1 = self.c_ports
        cw = word_index(src, cfg, "acc")
        m.d.comb += [c0.addr.eq(cw), c1.addr.eq(cw + 1)]
        ports += [c0, c1]
        need += [reads_c, reads_c & (src[:lw] + 4 * n > W)]
        step_done, words = gather(m, ports, need, issuing & ~empty)
        off_a = Signal(ll)
        off_b = Signal(ll)
        off_c = Signal(lw)
        m.d.sync += [off_a.eq(src[:ll]), off_b.eq(src_b[:ll]), off_c.eq(src[:lw])]
        a_bytes = Signal(16 * L)
        b_bytes = Signal(16 * L)
        m.d.comb += [
            a_bytes.eq(Cat(words[0], words[1]) >> (off_a * 8)),
            b_bytes.eq(Cat(words[2], words[3]) >> (off_b * 8)),
        ]
        c_bytes = Signal(16 * W)
        m.d.comb += c_bytes.eq(Cat(words[4], words[5]) >> (off_c * 8))

        # per-lane arithmetic
        results = []
        for l in range(VL):
            xa8 = a_bytes[8 * l : 8 * l + 8].as_signed()
            xb8 = b_bytes[8 * l : 8 * l + 8].as_signed()
            x32 = c_bytes[32 * l : 32 * l + 32].as_signed()
            prod = Signal(signed(72), name=f"prod{l}")
            with m.If(is_map):
                x = Mux(fm.src_type, x32, xa8 - fm.zp_in)
                m.d.comb += prod.eq(x * fm.mult)
            with m.Elif(is_add):
                m.d.comb += prod.eq((xa8 - fa.zp_a) * fa.mult_a + (xb8 - fa.zp_b) * fa.mult_b)
            with m.Else():
                total = Signal(signed(32), name=f"ptotal{l}")
                m.d.comb += total.eq(Mux(first_tap1, 0, pool_acc[l]) + xa8)
                mx = Signal(signed(32), name=f"pmax{l}")
                m.d.comb += mx.eq(Mux(first_tap1 | (xa8 > pool_acc[l]), xa8, pool_acc[l]))
                with m.If(v1):
                    m.d.sync += pool_acc[l].eq(Mux(fp.mode, total, mx))
                m.d.comb += prod.eq((total - fp.kh * fp.kw * fp.zp_in) * fp.mult)
            shift = Mux(is_map, fm.shift, Mux(is_add, fa.shift, fp.shift))
            zp_out = Mux(is_map, fm.zp_out, Mux(is_add, fa.zp_out, fp.zp_out))
            lo = Mux(is_map, fm.lo, Mux(is_add, fa.lo, fp.lo))
            hi = Mux(is_map, fm.hi, Mux(is_add, fa.hi, fp.hi))
            shifted = rsr(m, prod, shift, f"rsr{l}")
            val = Signal(signed(73), name=f"val{l}")
            m.d.comb += val.eq(shifted + zp_out)
            with m.If(is_pool & ~fp.mode):
                maxv = Mux(first_tap1 | (xa8 > pool_acc[l]), xa8, pool_acc[l])
                m.d.comb += val.eq(maxv)
            results.append(clamp8(m, val, lo, hi, f"y{l}"))

        # two-lane-word write of n bytes at dst
        do_write = Signal()
        m.d.comb += do_write.eq(v1 & write1 & (n1 != 0))
        shifted = Signal(16 * L)
        m.d.comb += shifted.eq(Cat(*results) << (dst1[:ll] * 8))
        be = Signal(2 * L)
        m.d.comb += be.eq(low_bytes_mask(n1, VL) << dst1[:ll])
        w0, w1 = self.w_ports
        m.d.comb += [
            w0.addr.eq(dst1[ll:]),
            w1.addr.eq(dst1[ll:] + 1),
            w0.data.eq(shifted[: 8 * L]),
            w1.data.eq(shifted[8 * L :]),
            w0.be.eq(be[:L]),
            w1.be.eq(be[L:]),
            w0.en.eq(do_write & be[:L].any()),
            w1.en.eq(do_write & be[L:].any()),
        ]

        m.d.sync += v1.eq(step_done)
        with m.If(issuing & (empty | (step_done & last))):
            m.d.sync += issuing.eq(0)
        finished = Signal()
        m.d.comb += finished.eq(active & ((issuing & empty) | (v1 & last1)))
        m.d.comb += self.exec.done.eq(finished)
        with m.If(step_done & ~last):
            with m.If(is_map):
                with m.If(i1 + VL >= fm.cols):
                    m.d.sync += [i1.eq(0), i0.eq(i0 + 1)]
                with m.Else():
                    m.d.sync += i1.eq(i1 + VL)
            with m.Elif(is_add):
                m.d.sync += i1.eq(i1 + VL)
            with m.Else():
                with m.If(tx + 1 < fp.kw):
                    m.d.sync += tx.eq(tx + 1)
                with m.Elif(ty + 1 < fp.kh):
                    m.d.sync += [tx.eq(0), ty.eq(ty + 1)]
                with m.Else():
                    m.d.sync += [tx.eq(0), ty.eq(0)]
                    with m.If(i2 + VL < fp.channels):
                        m.d.sync += i2.eq(i2 + VL)
                    with m.Else():
                        m.d.sync += i2.eq(0)
                        with m.If(i1 + 1 < fp.out_w):
                            m.d.sync += i1.eq(i1 + 1)
                        with m.Else():
                            m.d.sync += [i1.eq(0), i0.eq(i0 + 1)]
        with m.If(finished):
            m.d.sync += active.eq(0)
        with m.If(self.exec.go):
            m.d.sync += [active.eq(1), issuing.eq(1), i0.eq(0), i1.eq(0), i2.eq(0), ty.eq(0), tx.eq(0)]
        return m

"""Matrix unit: clusters x PEs x lanes int8 MACs sweeping one MATMUL's m x n x k problem.

Stage 0 asks the scratchpad for one step's operands, `clusters` A lane words and `pes_per_cluster`
B^T lane words (rows past m or n are not read); a banked scratchpad may grant them over several
cycles (operands that arrive early wait in registers). The cycle after the last grant the words are
there, and stage R registers each lane's multiplicands (the block-RAM read, its bank multiplexer
and the lane selection end in a register: Fmax); stage P multiplies them into the product
registers of every PE's lanes (the multiplies take a cycle of their own); then stage 1 adds each
PE (i, j)'s `lanes` products, the dot product of A row i and B^T row j, to its int32 accumulator.
After the last k step of an output tile each cluster writes its row of `pes_per_cluster` int32
results (added to the old C row when accumulating) to the accumulator memory, while the next tile
starts. Loop order: m tiles, n tiles, k steps.

An int16 A (`a_i16`) keeps the lane words and the multipliers: a step reads one A word (lanes / 2
int16 elements) and B^T word kb // 2, whose lower or upper half holds the matching int8 elements.
Each lane multiplies one A byte by its element's B^T byte, the low byte unsigned and the high byte
signed (9 x 8 bits either way); the high bytes' products count 256 times in the sum, which is then
the int16 dot product. So an int16 A costs twice the steps and no wider multiplier.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from npu.config import ACC_BASE, NpuConfig
from npu.isa import INSTR_BITS, Opcode

from .common import exec_signature, log2, view
from .spad import gather


class MatrixUnit(wiring.Component):
    def __init__(self, cfg: NpuConfig, a_ports, b_ports, c_rports, c_wports):
        """a_ports, b_ports: scratchpad clients (hdl/spad.py) of one lane word each; c_rports,
        c_wports: accumulator read and write clients of one word, one per cluster."""
        self.cfg = cfg
        self.a_ports, self.b_ports = a_ports, b_ports
        self.c_rports, self.c_wports = c_rports, c_wports
        super().__init__({"exec": In(exec_signature())})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W, L = cfg.bus_bytes, cfg.lanes
        CM, CN = cfg.clusters, cfg.pes_per_cluster
        lw, ll = log2(W), log2(L)
        ins = Signal(INSTR_BITS)
        f = view(Opcode.MATMUL, ins)
        with m.If(self.exec.go):
            m.d.sync += ins.eq(self.exec.instr)
        active = Signal()
        m.d.comb += self.exec.busy.eq(active)

        MB = Signal(16)
        NB = Signal(16)
        KB = Signal(16)
        m.d.comb += [
            MB.eq((f.m + CM - 1) // CM),
            NB.eq((f.n + CN - 1) // CN),
            KB.eq(Mux(f.k == 0, 1, ((f.k << f.a_i16) + L - 1) >> ll)),  # int16 A: 2k bytes a row
        ]
        mb = Signal(16)
        nb = Signal(16)
        kb = Signal(16)
        a_tile = Signal(40)  # byte address of A row mb*CM
        b_tile = Signal(40)  # byte address of B^T row nb*CN
        c_tile = Signal(40)  # byte offset (from ACC_BASE) of C row mb*CM
        empty = Signal()
        m.d.comb += empty.eq((f.m == 0) | (f.n == 0))

        # stage 0 asks for one step's operands (and, at the last k step of an accumulating MATMUL,
        # the C rows) until all are granted; stage R registers the lanes' multiplicands the cycle
        # after, and stage P multiplies them into stage 1's product registers (each holding while
        # the next stage is busy); stage 1 accumulates, and at the last k step writes the C rows,
        # holding until the accumulators have taken every row. Each step's flags follow it (_g: its
        # operands in gather's registers, _r: stage R, _1: stage 1).
        vg = Signal()  # a step's operands wait in gather's registers for stage R
        vr = Signal()  # stage R holds a step (its multiplicands)
        v1 = Signal()  # stage 1 holds a step (its products)
        s1_done = Signal()  # ... and finishes with it this cycle
        kb0_g, kb0_r, kb0_1 = Signal(), Signal(), Signal()
        last_kg, last_kr, last_k1 = Signal(), Signal(), Signal()
        last_g, last_r, last1 = Signal(), Signal(), Signal()  # the instruction's last step
        issuing = Signal()  # stage 0 has steps left to issue
        last_k = Signal()
        m.d.comb += last_k.eq(kb == KB - 1)
        ports = list(self.a_ports) + list(self.b_ports) + list(self.c_rports)
        need = []
        c_addr = []
        for r, port in enumerate(ports):
            nd = Signal(name=f"op_need{r}")
            if r < CM + CN:
                a_side = r < CM
                i = r if a_side else r - CM
                if a_side:
                    tile, stride, first, limit = a_tile, f.a_stride, mb * CM, f.m
                else:
                    tile, stride, first, limit = b_tile, f.b_stride, nb * CN, f.n
                # int16 A: step kb reads A word kb and B^T word kb // 2
                kw = kb if a_side else Mux(f.a_i16, kb >> 1, kb)
                addr = Signal(40, name=f"op_addr{r}")
                m.d.comb += [addr.eq(tile + i * stride + (kw << ll)), port.addr.eq(addr[ll:])]
                m.d.comb += nd.eq(issuing & ~empty & (first + i < limit))
            else:
                i = r - CM - CN
                addr = Signal(40, name=f"c_addr{i}")
                m.d.comb += [addr.eq(c_tile + i * f.c_stride + (nb << lw)), port.addr.eq(addr[lw:])]
                m.d.comb += nd.eq(issuing & ~empty & last_k & f.accumulate & (mb * CM + i < f.m))
                c_addr.append(addr)
            need.append(nd)
        s1_free = Signal()  # stage 1 can take a step
        m.d.comb += s1_free.eq(~v1 | s1_done)
        xfer = Signal()  # stage R's multiplicands are multiplied into stage 1's product registers
        m.d.comb += xfer.eq(vr & s1_free)
        r_free = Signal()  # stage R can take a step
        m.d.comb += r_free.eq(~vr | s1_free)
        take = Signal()  # stage R takes the operands waiting in gather's registers
        m.d.comb += take.eq(vg & r_free)
        g_free = Signal()  # gather's registers may be refilled
        m.d.comb += g_free.eq(~vg | r_free)
        step_done, vals = gather(m, ports, need, issuing & ~empty, g_free)
        a_vals, b_vals, c_vals = vals[:CM], vals[CM : CM + CN], vals[CM + CN :]
        # lanes past k read as zero (A bytes past the row's k or 2k bytes)
        lane_ok = [Signal(name=f"lane_ok{t}") for t in range(L)]
        upper = Signal()  # int16 A: the step uses the upper half of its B^T word (odd kb)
        for t in range(L):
            with m.If(step_done):
                m.d.sync += lane_ok[t].eq((kb << ll) + t < (f.k << f.a_i16))
        with m.If(step_done):
            m.d.sync += upper.eq(kb[0])

        def a_lane(v, t):
            """A byte t as a 9-bit multiplicand: signed for int8 A and for an int16 element's high
            byte (odd t), unsigned for its low byte (even t)."""
            byte = v[8 * t : 8 * t + 8]
            ext = byte[7] if t % 2 else byte[7] & ~f.a_i16
            return Mux(lane_ok[t], Cat(byte, ext).as_signed(), 0)

        def b_lane(v, t):
            """B^T byte of A lane t: byte t, or with int16 A byte t // 2 of the step's half."""
            lo_b, hi_b = t // 2, L // 2 + t // 2
            wide = Mux(upper, v[8 * hi_b : 8 * hi_b + 8], v[8 * lo_b : 8 * lo_b + 8])
            return Mux(f.a_i16, wide, v[8 * t : 8 * t + 8]).as_signed()

        accs = [[Signal(signed(32), name=f"acc{i}_{j}") for j in range(CN)] for i in range(CM)]
        sums = [[Signal(signed(32), name=f"sum{i}_{j}") for j in range(CN)] for i in range(CM)]
        # stage R: every lane's multiplicands, registered as it takes the step; the old C rows go
        # along to stage 1 (registered at each hand-over, as a stage holds its own step's)
        a_ops = [[Signal(signed(9), name=f"a_op{i}_{t}") for t in range(L)] for i in range(CM)]
        b_ops = [[Signal(signed(8), name=f"b_op{j}_{t}") for t in range(L)] for j in range(CN)]
        with m.If(take):
            m.d.sync += [a_ops[i][t].eq(a_lane(a_vals[i], t)) for i in range(CM) for t in range(L)]
            m.d.sync += [b_ops[j][t].eq(b_lane(b_vals[j], t)) for j in range(CN) for t in range(L)]
        old_c = []
        for i, v in enumerate(c_vals):
            for stage, go in (("r", take), ("1", xfer)):
                reg = Signal(len(v), name=f"old_c{i}_{stage}")
                with m.If(go):
                    m.d.sync += reg.eq(v)
                v = reg
            old_c.append(v)
        # stage P: the products, registered as stage 1 takes the step
        for i in range(CM):
            for j in range(CN):
                prods = []
                for t in range(L):
                    pr = Signal(signed(17), name=f"prod{i}_{j}_{t}")  # 9 x 8 bits
                    with m.If(xfer):
                        m.d.sync += pr.eq(a_ops[i][t] * b_ops[j][t])
                    prods.append(pr)
                # int16 A: the odd lanes' products are of high bytes, worth 256 times theirs
                odd = sum(prods[1::2])
                dot = sum(prods[0::2]) + Mux(f.a_i16, odd << 8, odd)
                m.d.comb += sums[i][j].eq(Mux(kb0_1, 0, accs[i][j]) + dot)
                with m.If(v1 & s1_done):
                    m.d.sync += accs[i][j].eq(sums[i][j])

        # write back C rows at the last k step (stage 1)
        written = Signal(CM)  # rows the accumulators took in an earlier cycle of this step
        w_need = []
        for i in range(CM):
            wp = self.c_wports[i]
            row_ok = Signal(name=f"c_row_ok{i}")
            col_ok = [Signal(name=f"c_col_ok{i}_{j}") for j in range(CN)]
            # the write's address and row/column masks, from stage 0 along the stages to stage 1
            chain = [(step_done, "g"), (take, "r")]
            waddr, row_ok_s = c_addr[i][lw:], mb * CM + i < f.m
            cols = [(nb * CN + j) < f.n for j in range(CN)]
            for go, stage in chain:
                wa = Signal(len(wp.addr), name=f"c_waddr_{stage}{i}")
                ro = Signal(name=f"c_row_ok_{stage}{i}")
                co = [Signal(name=f"c_col_ok_{stage}{i}_{j}") for j in range(CN)]
                with m.If(go):
                    m.d.sync += [wa.eq(waddr), ro.eq(row_ok_s)]
                    m.d.sync += [c.eq(v) for c, v in zip(co, cols, strict=True)]
                waddr, row_ok_s, cols = wa, ro, co
            with m.If(xfer):
                m.d.sync += [wp.addr.eq(waddr), row_ok.eq(row_ok_s)]
            new = []
            for j in range(CN):
                with m.If(xfer):
                    m.d.sync += col_ok[j].eq(cols[j])
                old = old_c[i][32 * j : 32 * j + 32].as_signed()
                new.append((Mux(f.accumulate, old, 0) + sums[i][j])[:32])
            wn = Signal(name=f"c_wneed{i}")
            m.d.comb += wn.eq(v1 & last_k1 & row_ok)
            w_need.append(wn)
            m.d.comb += [
                wp.data.eq(Cat(*new)),
                wp.be.eq(Cat(*[c.replicate(4) for c in col_ok])),
                wp.en.eq(wn & ~written[i]),
            ]
        w_granted = Cat(*[p.grant for p in self.c_wports])
        m.d.comb += s1_done.eq(v1 & (written | w_granted | ~Cat(*w_need)).all())
        with m.If(s1_done | ~v1):
            m.d.sync += written.eq(0)
        with m.Else():
            m.d.sync += written.eq(written | (w_granted & Cat(*[p.en for p in self.c_wports])))

        # loop counters (stage 0) and the hand-over to stage 1
        last_step = Signal()
        m.d.comb += last_step.eq(last_k & (nb == NB - 1) & (mb == MB - 1))
        m.d.sync += [
            vg.eq(step_done | (vg & ~r_free)),
            vr.eq(take | (vr & ~s1_free)),
            v1.eq(xfer | (v1 & ~s1_done)),
        ]
        with m.If(step_done):
            m.d.sync += [kb0_g.eq(kb == 0), last_kg.eq(last_k), last_g.eq(last_step)]
        with m.If(take):
            m.d.sync += [kb0_r.eq(kb0_g), last_kr.eq(last_kg), last_r.eq(last_g)]
        with m.If(xfer):
            m.d.sync += [kb0_1.eq(kb0_r), last_k1.eq(last_kr), last1.eq(last_r)]
        with m.If(issuing & (empty | (step_done & last_step))):
            m.d.sync += issuing.eq(0)
        finished = Signal()
        m.d.comb += finished.eq(active & ((empty & issuing) | (s1_done & last1)))
        m.d.comb += self.exec.done.eq(finished)
        with m.If(step_done):
            with m.If(~last_k):
                m.d.sync += kb.eq(kb + 1)
            with m.Else():
                m.d.sync += kb.eq(0)
                with m.If(nb == NB - 1):
                    m.d.sync += [
                        nb.eq(0),
                        b_tile.eq(f.b),
                        mb.eq(mb + 1),
                        a_tile.eq(a_tile + CM * f.a_stride),
                        c_tile.eq(c_tile + CM * f.c_stride),
                    ]
                with m.Else():
                    m.d.sync += [nb.eq(nb + 1), b_tile.eq(b_tile + CN * f.b_stride)]
        with m.If(finished):
            m.d.sync += active.eq(0)
        with m.If(self.exec.go):
            nf = view(Opcode.MATMUL, self.exec.instr)
            m.d.sync += [
                active.eq(1),
                issuing.eq(1),
                mb.eq(0),
                nb.eq(0),
                kb.eq(0),
                a_tile.eq(nf.a),
                b_tile.eq(nf.b),
                c_tile.eq(nf.c - ACC_BASE),
            ]
        return m

"""Matrix unit: clusters x PEs x lanes int8 MACs sweeping one MATMUL's m x n x k problem.

Each cycle the unit issues reads of `clusters` A words and `pes_per_cluster` B^T words (`lanes` bytes
each, selected from scratchpad words); the memories answer the next cycle (registered reads), when
every PE (i, j) adds the `lanes`-long dot product of A row i and
B^T row j to its int32 accumulator. After the last k step of an output tile each cluster writes its
row of `pes_per_cluster` int32 results (added to the old C row when accumulating) to the
accumulator memory, while the next tile starts. Loop order: m tiles, n tiles, k steps.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.config import ACC_BASE, NpuConfig
from npu.isa import INSTR_BITS, Opcode

from .common import log2, view


class MatrixUnit(wiring.Component):
    def __init__(self, cfg: NpuConfig, a_rps, b_rps, c_rps, c_wps):
        self.cfg = cfg
        self.a_rps, self.b_rps, self.c_rps, self.c_wps = a_rps, b_rps, c_rps, c_wps
        super().__init__({"go": In(1), "instr": In(INSTR_BITS), "busy": Out(1), "done": Out(1)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W, L = cfg.bus_bytes, cfg.lanes
        CM, CN = cfg.clusters, cfg.pes_per_cluster
        lw, ll = log2(W), log2(L)
        ins = Signal(INSTR_BITS)
        f = view(Opcode.MATMUL, ins)
        with m.If(self.go):
            m.d.sync += ins.eq(self.instr)
        active = Signal()
        m.d.comb += self.busy.eq(active)

        MB = Signal(16)
        NB = Signal(16)
        KB = Signal(16)
        m.d.comb += [
            MB.eq((f.m + CM - 1) // CM),
            NB.eq((f.n + CN - 1) // CN),
            KB.eq(Mux(f.k == 0, 1, (f.k + L - 1) >> ll)),
        ]
        mb = Signal(16)
        nb = Signal(16)
        kb = Signal(16)
        a_tile = Signal(40)  # byte address of A row mb*CM
        b_tile = Signal(40)  # byte address of B^T row nb*CN
        c_tile = Signal(40)  # byte offset (from ACC_BASE) of C row mb*CM
        empty = Signal()
        m.d.comb += empty.eq((f.m == 0) | (f.n == 0))

        # stage 0 issues the reads of one step (A rows i, B^T rows j, k bytes kb*L .. kb*L+L-1, and at
        # the last k step the C row each cluster will write); the memories answer a cycle later, when
        # stage 1 multiplies, accumulates and writes C. The step's control travels with it.
        v1 = Signal()  # stage 1 holds a step
        kb0_1 = Signal()
        last_k1 = Signal()
        last1 = Signal()  # the instruction's last step
        lane_sel1 = []
        for name, ports, tile, stride in (
            ("a", self.a_rps, a_tile, f.a_stride),
            ("b", self.b_rps, b_tile, f.b_stride),
        ):
            for i, port in enumerate(ports):
                addr = Signal(40, name=f"{name}_addr{i}")
                m.d.comb += [addr.eq(tile + i * stride + (kb << ll)), port.addr.eq(addr[lw:])]
                sel = Signal(max(1, lw - ll), name=f"{name}_lane{i}")
                if lw > ll:
                    m.d.sync += sel.eq(addr[ll:lw])
                lane_sel1.append(sel)
        a_vals = [
            port.data.word_select(lane_sel1[i], 8 * L) if lw > ll else port.data[: 8 * L]
            for i, port in enumerate(self.a_rps)
        ]
        b_vals = [
            port.data.word_select(lane_sel1[CM + j], 8 * L) if lw > ll else port.data[: 8 * L]
            for j, port in enumerate(self.b_rps)
        ]
        # lanes past k read as zero
        lane_ok = [Signal(name=f"lane_ok{t}") for t in range(L)]
        for t in range(L):
            m.d.sync += lane_ok[t].eq((kb << ll) + t < f.k)

        def lane(v, t):
            return Mux(lane_ok[t], v[8 * t : 8 * t + 8].as_signed(), 0)

        accs = [[Signal(signed(32), name=f"acc{i}_{j}") for j in range(CN)] for i in range(CM)]
        sums = [[Signal(signed(32), name=f"sum{i}_{j}") for j in range(CN)] for i in range(CM)]
        for i in range(CM):
            for j in range(CN):
                dot = sum(lane(a_vals[i], t) * b_vals[j][8 * t : 8 * t + 8].as_signed() for t in range(L))
                m.d.comb += sums[i][j].eq(Mux(kb0_1, 0, accs[i][j]) + dot)
                with m.If(v1):
                    m.d.sync += accs[i][j].eq(sums[i][j])

        # write back C rows at the last k step (read issued in stage 0, written in stage 1)
        last_k = Signal()
        m.d.comb += last_k.eq(kb == KB - 1)
        for i in range(CM):
            row = Signal(17, name=f"c_row{i}")
            m.d.comb += row.eq(mb * CM + i)
            addr = Signal(40, name=f"c_addr{i}")
            m.d.comb += addr.eq(c_tile + i * f.c_stride + (nb << lw))
            rp, wp = self.c_rps[i], self.c_wps[i]
            m.d.comb += rp.addr.eq(addr[lw:])
            m.d.sync += wp.addr.eq(addr[lw:])
            row_ok = Signal(name=f"c_row_ok{i}")
            m.d.sync += row_ok.eq(row < f.m)
            col_ok = [Signal(name=f"c_col_ok{i}_{j}") for j in range(CN)]
            new = []
            for j in range(CN):
                m.d.sync += col_ok[j].eq((nb * CN + j) < f.n)
                old = rp.data[32 * j : 32 * j + 32].as_signed()
                new.append((Mux(f.accumulate, old, 0) + sums[i][j])[:32])
            m.d.comb += [
                wp.data.eq(Cat(*new)),
                wp.en.eq(Mux(v1 & last_k1 & row_ok, Cat(*[c.replicate(4) for c in col_ok]), 0)),
            ]

        # loop counters (stage 0) and the hand-over to stage 1
        issuing = Signal()  # stage 0 has steps left to issue
        last_step = Signal()
        m.d.comb += last_step.eq(last_k & (nb == NB - 1) & (mb == MB - 1))
        m.d.sync += [v1.eq(issuing & ~empty), kb0_1.eq(kb == 0), last_k1.eq(last_k), last1.eq(last_step)]
        with m.If(issuing & (empty | last_step)):
            m.d.sync += issuing.eq(0)
        finished = Signal()
        m.d.comb += finished.eq(active & ((empty & issuing) | (v1 & last1)))
        m.d.comb += self.done.eq(finished)
        with m.If(issuing & ~empty):
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
        with m.If(self.go):
            nf = view(Opcode.MATMUL, self.instr)
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

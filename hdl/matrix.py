"""Matrix unit: clusters x PEs x lanes int8 MACs sweeping one MATMUL's m x n x k problem.

Each cycle the unit reads `clusters` A words and `pes_per_cluster` B^T words (`lanes` bytes each,
selected from scratchpad words), and every PE (i, j) adds the `lanes`-long dot product of A row i and
B^T row j to its int32 accumulator. After the last k step of an output tile each cluster writes its
row of `pes_per_cluster` int32 results (added to the old C row when accumulating) to the
accumulator memory, while the next tile starts. Loop order: m tiles, n tiles, k steps.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed
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
        running = Signal()
        m.d.comb += running.eq(active & ~empty)

        # operand fetch: A rows i, B^T rows j, k bytes kb*L .. kb*L+L-1
        a_vals = []
        for i, port in enumerate(self.a_rps):
            addr = Signal(40, name=f"a_addr{i}")
            m.d.comb += [addr.eq(a_tile + i * f.a_stride + (kb << ll)), port.addr.eq(addr[lw:])]
            lane_sel = addr[ll:lw] if lw > ll else Const(0, 1)
            a_vals.append(port.data.word_select(lane_sel, 8 * L) if lw > ll else port.data[: 8 * L])
        b_vals = []
        for j, port in enumerate(self.b_rps):
            addr = Signal(40, name=f"b_addr{j}")
            m.d.comb += [addr.eq(b_tile + j * f.b_stride + (kb << ll)), port.addr.eq(addr[lw:])]
            lane_sel = addr[ll:lw] if lw > ll else Const(0, 1)
            b_vals.append(port.data.word_select(lane_sel, 8 * L) if lw > ll else port.data[: 8 * L])
        # lanes past k read as zero
        lane_ok = [Signal(name=f"lane_ok{t}") for t in range(L)]
        for t in range(L):
            m.d.comb += lane_ok[t].eq((kb << ll) + t < f.k)

        def lane(v, t):
            return Mux(lane_ok[t], v[8 * t : 8 * t + 8].as_signed(), 0)

        accs = [[Signal(signed(32), name=f"acc{i}_{j}") for j in range(CN)] for i in range(CM)]
        sums = [[Signal(signed(32), name=f"sum{i}_{j}") for j in range(CN)] for i in range(CM)]
        for i in range(CM):
            for j in range(CN):
                dot = sum(lane(a_vals[i], t) * b_vals[j][8 * t : 8 * t + 8].as_signed() for t in range(L))
                m.d.comb += sums[i][j].eq(Mux(kb == 0, 0, accs[i][j]) + dot)
                with m.If(running):
                    m.d.sync += accs[i][j].eq(sums[i][j])

        # write back C rows at the last k step
        last_k = Signal()
        m.d.comb += last_k.eq(kb == KB - 1)
        for i in range(CM):
            row = Signal(17, name=f"c_row{i}")
            m.d.comb += row.eq(mb * CM + i)
            addr = Signal(40, name=f"c_addr{i}")
            m.d.comb += addr.eq(c_tile + i * f.c_stride + (nb << lw))
            rp, wp = self.c_rps[i], self.c_wps[i]
            m.d.comb += [rp.addr.eq(addr[lw:]), wp.addr.eq(addr[lw:])]
            new = []
            en = []
            for j in range(CN):
                old = rp.data[32 * j : 32 * j + 32].as_signed()
                new.append((Mux(f.accumulate, old, 0) + sums[i][j])[:32])
                col_ok = (nb * CN + j) < f.n
                en.append(col_ok.replicate(4))
            m.d.comb += [
                wp.data.eq(Cat(*new)),
                wp.en.eq(Mux(running & last_k & (row < f.m), Cat(*en), 0)),
            ]

        # loop counters
        finished = Signal()
        m.d.comb += finished.eq(active & (empty | (last_k & (nb == NB - 1) & (mb == MB - 1))))
        m.d.comb += self.done.eq(finished)
        with m.If(running):
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
                mb.eq(0),
                nb.eq(0),
                kb.eq(0),
                a_tile.eq(nf.a),
                b_tile.eq(nf.b),
                c_tile.eq(nf.c - ACC_BASE),
            ]
        return m

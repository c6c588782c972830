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

With `a16_full_rate` a lane multiplies a whole A element, int16 or sign-extended int8, by its B^T
byte (16 x 8 bits), and each cluster reads a second A word of the step (`a_hi_ports`) when A is
int16: a step covers `lanes` elements either way, so int16 A takes int8's steps.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from npu.config import ACC_BASE, NpuConfig
from npu.isa import INSTR_BITS, Opcode

from .common import exec_signature, follow, log2, times, tree, view
from .spad import gather, shared_client


class MatrixUnit(wiring.Component):
    def __init__(self, cfg: NpuConfig, a_ports, b_ports, c_rports, c_wports, a_hi_ports=(), fill_ports=()):
        """a_ports, b_ports: scratchpad clients (hdl/spad.py) of one lane word each; c_rports,
        c_wports: accumulator read and write clients of one word, one per cluster (with `c_clients`,
        that many: cluster i's rows on client i mod c_clients, in turn); a_hi_ports (with
        `a16_full_rate`): each cluster's second A word of an int16 step; fill_ports (with
        `a_stage_bytes`, in place of a_ports and a_hi_ports): the two reads that stage A rows."""
        self.cfg = cfg
        self.a_ports, self.b_ports = list(a_ports), b_ports
        self.a_hi_ports = list(a_hi_ports)
        self.fill_ports = list(fill_ports)
        staged = bool(cfg.a_stage_bytes)
        assert len(self.fill_ports) == (2 if staged else 0)
        assert len(self.a_ports) == (0 if staged else cfg.clusters)
        assert len(self.a_hi_ports) == (cfg.clusters if cfg.a16_full_rate and not staged else 0)
        assert len(c_rports) == len(c_wports) == cfg.c_ports
        self.c_rports, self.c_wports = c_rports, c_wports
        super().__init__({"exec": In(exec_signature())})

    def elaborate(self, platform):
        m = Module()
        u = SimpleNamespace()  # what the parts below share: their signals and views
        u.c_rports, u.c_wports = self._c_ports(m)
        self._decode(m, u)
        self._loop_state(m, u)
        if self.cfg.a_stage_bytes:
            self._stage(m, u)
        self._requests(m, u)
        self._multiply(m, u)
        self._write_back(m, u)
        self._handover(m, u)
        self._loop(m, u)
        return m

    def _c_ports(self, m: Module) -> tuple[list, list]:
        """Each cluster's C row read and write client: its own, or with `c_clients` cluster i's
        shared on client i mod c_clients (`shared_client`; the accumulators' two banks a region take
        two rows a cycle at most anyway)."""
        CM, n = self.cfg.clusters, self.cfg.c_clients
        if not n:
            return list(self.c_rports), list(self.c_wports)
        reads, writes = [None] * CM, [None] * CM
        for q in range(n):
            rows = range(q, CM, n)
            for kind, ports, port in (("r", reads, self.c_rports[q]), ("w", writes, self.c_wports[q])):
                for i, c in zip(rows, shared_client(m, port, len(rows), f"c{kind}{q}_"), strict=True):
                    ports[i] = c
        return reads, writes

    def _decode(self, m: Module, u: SimpleNamespace) -> None:
        """The instruction register and `busy`."""
        ins = Signal(INSTR_BITS)
        f = view(Opcode.MATMUL, ins)
        with m.If(self.exec.go):
            m.d.sync += ins.eq(self.exec.instr)
        active = Signal()
        m.d.comb += self.exec.busy.eq(active)
        u.f, u.active = f, active

    def _loop_state(self, m: Module, u: SimpleNamespace) -> None:
        """Stage 0's loop registers: steps left, the tile's rows and columns, the operands' addresses."""
        cfg = self.cfg
        L, CM, CN, ll = cfg.lanes, cfg.clusters, cfg.pes_per_cluster, log2(cfg.lanes)
        # Stage 0 issues from registers: the loop state (steps left, which rows and columns exist,
        # every port's word address) is set up at `go` and advanced as each step is granted, so a
        # request never waits on the instruction's arithmetic (Fmax: the requests cross the
        # memories' arbiters to other units' grants in the same cycle).
        nf = view(Opcode.MATMUL, self.exec.instr)
        if cfg.a16_full_rate:  # k steps: lanes elements a step, int8 or int16
            n_kb = Mux(nf.k == 0, 1, (nf.k + L - 1) >> ll)
        else:  # int16 A: 2k bytes a row, lanes bytes a step
            n_kb = Mux(nf.k == 0, 1, ((nf.k << nf.a_i16) + L - 1) >> ll)
        kb = Signal(16)  # the step's k step (its lanes' first byte)
        k_left = Signal(16)  # k steps of this tile after the current one
        k_last = Signal(16)  # KB - 1
        last_k = Signal()  # k_left == 0
        m_rem = Signal(16)  # rows from the current tile's first (mb * CM) to m
        n_rem = Signal(16)  # columns from nb * CN to n
        row_ok = Signal(CM)  # row mb*CM + i exists
        col_ok = Signal(CN)  # column nb*CN + j exists
        last_mb = Signal()
        last_nb = Signal()
        empty = Signal()
        # on-chip byte addresses; 20 bits where A is staged (every memory ends below 2**19, and the
        # checks keep a MATMUL's footprints inside them: its eight clusters' rows cost LUTs)
        aw = 20 if cfg.a_stage_bytes else 40
        a_row = [Signal(aw, name=f"a_row{i}") for i in range(CM)]  # byte address of A row mb*CM+i
        b_row = [Signal(aw, name=f"b_row{j}") for j in range(CN)]  # ... of B^T row nb*CN+j
        c_row = [Signal(aw, name=f"c_row{i}") for i in range(CM)]  # offset from ACC_BASE of C row
        a_addr = [Signal(aw, name=f"op_addr{i}") for i in range(CM)]  # the step's words
        b_addr = [Signal(aw, name=f"op_addr{CM + j}") for j in range(CN)]
        c_addr = [Signal(aw, name=f"c_addr{i}") for i in range(CM)]
        u.nf, u.n_kb, u.kb, u.k_left, u.k_last, u.last_k = nf, n_kb, kb, k_left, k_last, last_k
        u.m_rem, u.n_rem, u.row_ok, u.col_ok, u.last_mb = m_rem, n_rem, row_ok, col_ok, last_mb
        u.last_nb, u.empty, u.a_row, u.b_row, u.c_row, u.a_addr = last_nb, empty, a_row, b_row, c_row, a_addr
        u.b_addr, u.c_addr = b_addr, c_addr

    def _stage(self, m: Module, u: SimpleNamespace) -> None:
        """A rows staged in the unit (`a_stage_bytes`), double-buffered. A job is one m tile's chunk
        of k steps; each cluster's block RAM holds two buffers of its A row's words of a job (pairs
        of lane words). The fill stages a job's rows into one buffer (`_fill`) while the steps read
        the previous job's from the other: every cluster's A words at one address, no scratchpad
        read, granted at once. A row longer than a buffer runs in chunks: every n tile of the m tile
        over the chunk's k steps, then the next chunk, whose C rows add to the previous chunk's (as
        an accumulating MATMUL's do; mod 2**32, so the result is the same)."""
        cfg = self.cfg
        L, CM = cfg.lanes, cfg.clusters
        D = cfg.a_stage_bytes // (2 * L)  # pairs a buffer holds (a power of two)
        f = u.f
        pairstep = Signal()  # a step takes a whole pair (int16 A at the int8 rate), else a half
        m.d.comb += pairstep.eq(f.a_i16 if cfg.a16_full_rate else 0)
        kc = Signal(16)  # k steps a chunk holds
        m.d.comb += kc.eq(Mux(pairstep, D, 2 * D))
        sel = Signal()  # the buffer the steps read
        fsel = Signal()  # the buffer the fill writes
        ready = [Signal(name=f"stage_ready{b}") for b in range(2)]  # filled, its steps not all issued
        release = Signal()  # the steps' job ends: its buffer is free
        fdone = Signal()  # the fill's job ends: its buffer is ready
        ports = []
        writes = []
        for i in range(CM):
            mem = Memory(shape=unsigned(16 * L), depth=2 * D, init=[])
            m.submodules[f"stage{i}"] = mem
            rp, wp = mem.read_port(domain="sync"), mem.write_port()
            port = SimpleNamespace(
                addr=Signal(range(D), name=f"stage_addr{i}"),
                en=Signal(name=f"stage_en{i}"),
                grant=Signal(name=f"stage_grant{i}"),
                data=rp.data,
                read=rp,  # enabled only while the stages can take a step: its data holds meanwhile
            )
            m.d.comb += [rp.addr.eq(Cat(port.addr, sel)), port.grant.eq(port.en)]
            ports.append(port)
            writes.append(wp)
        with m.If(release):
            m.d.sync += sel.eq(~sel)
        with m.If(fdone):
            m.d.sync += fsel.eq(~fsel)
        for b in range(2):
            with m.If(fdone & (fsel == b)):
                m.d.sync += ready[b].eq(1)
            with m.If(release & (sel == b)):
                m.d.sync += ready[b].eq(0)
        setup = Signal()  # the steps' next job: its loop registers are set this cycle
        u.stage = SimpleNamespace(
            ports=ports, pairstep=pairstep, kc=kc, k_all=Signal(16), kbase=Signal(16), sel=sel,
            fsel=fsel, ready_bits=ready, release=release, fdone=fdone, setup=setup, start=Signal(),
            busy=setup | ~Mux(sel, ready[1], ready[0]), free=~Mux(fsel, ready[1], ready[0]),
        )
        self._fill(m, u, writes)
        self._job_setup(m, u)

    def _fill(self, m: Module, u: SimpleNamespace, writes: list) -> None:
        """The fill's own walk over the jobs (m tiles, then chunks), ahead of the steps: a job starts
        when there is one and its buffer is free; `filling` asks for a pair a cycle, `fwr` writes the
        pair granted the cycle before, and the job's last write makes its buffer ready."""
        cfg = self.cfg
        L, CM, ll = cfg.lanes, cfg.clusters, log2(cfg.lanes)
        D = cfg.a_stage_bytes // (2 * L)
        f, st = u.f, u.stage
        fjob = Signal()  # a job is left to fill: the one below
        fbase = Signal(20)  # its first A row's byte address
        fkbase = Signal(16)  # its first k step
        f_mrem = Signal(16)  # rows from its first to m
        f_row_ok = Signal(CM)  # row i of its m tile exists
        filling, fwr, flast = Signal(), Signal(), Signal()
        rows_ok = Signal(CM)  # ... of the job being filled
        fr, fw_row = Signal(range(CM)), Signal(range(CM))
        fp, fp_last = Signal(16), Signal(16)
        fw_pair = Signal(range(2 * D))
        faddr = Signal(20)
        frow = Signal(20)  # the row's first byte
        faoff = Signal(20)  # the job's first byte in an A row
        f0, f1 = self.fill_ports
        m.d.comb += [f0.addr.eq(faddr[ll:]), f1.addr.eq(faddr[ll:] + 1)]
        f_done, f_words = gather(m, [f0, f1], [filling, filling], filling, name="fill")
        m.d.sync += [fwr.eq(f_done), st.fdone.eq(f_done & flast)]
        with m.If(f_done):
            m.d.sync += [fw_row.eq(fr), fw_pair.eq(Cat(fp[: log2(D)], st.fsel))]
        for i, wp in enumerate(writes):
            m.d.comb += [wp.addr.eq(fw_pair), wp.data.eq(Cat(*f_words)), wp.en.eq(fwr & (fw_row == i))]
        row_next = Signal(range(CM + 1))
        m.d.comb += row_next.eq(fr + 1)
        more_rows = Signal()  # row fr + 1 of the job exists
        m.d.comb += more_rows.eq((row_next < CM) & (rows_ok >> row_next)[0])
        m.d.comb += flast.eq((fp == fp_last) & ~more_rows)
        with m.If(f_done):
            with m.If(fp != fp_last):
                m.d.sync += [fp.eq(fp + 1), faddr.eq(faddr + 2 * L)]
            with m.Elif(more_rows):
                nrow = frow + f.a_stride
                m.d.sync += [frow.eq(nrow), faddr.eq(nrow + faoff), fr.eq(row_next), fp.eq(0)]
            with m.Else():
                m.d.sync += filling.eq(0)
        # a job's start: its pairs and offset from fkbase; the walk moves to the next job
        left = Signal(16)  # k steps from the job's first to the tile's end
        m.d.comb += left.eq(st.k_all + 1 - fkbase)
        steps = Signal(16)
        m.d.comb += steps.eq(Mux(left > st.kc, st.kc, left))
        aoff = Signal(20)
        m.d.comb += aoff.eq(Mux(st.pairstep, fkbase << (ll + 1), fkbase << ll))
        start = st.start
        m.d.comb += start.eq(fjob & st.free & ~filling & ~fwr)
        with m.If(start):
            m.d.sync += [
                filling.eq(1),
                fr.eq(0),
                fp.eq(0),
                fp_last.eq(Mux(st.pairstep, steps - 1, (steps - 1) >> 1)),
                faddr.eq(fbase + aoff),
                frow.eq(fbase),
                faoff.eq(aoff),
                rows_ok.eq(f_row_ok),
            ]
            with m.If(left > st.kc):  # the tile's next chunk
                m.d.sync += fkbase.eq(fkbase + st.kc)
            with m.Else():  # the next m tile's first
                m.d.sync += [
                    fkbase.eq(0),
                    fbase.eq(fbase + f.a_stride * CM),
                    f_mrem.eq(f_mrem - CM),
                    f_row_ok.eq(Cat(*[f_mrem > CM + i for i in range(CM)])),
                    fjob.eq(f_mrem > CM),
                ]
        nf = u.nf
        with m.If(self.exec.go):
            m.d.sync += [
                fjob.eq((nf.m != 0) & (nf.n != 0)),
                fbase.eq(nf.a),
                fkbase.eq(0),
                f_mrem.eq(nf.m),
                f_row_ok.eq(Cat(*[nf.m > i for i in range(CM)])),
                st.sel.eq(0),
                st.fsel.eq(0),
                *[r.eq(0) for r in st.ready_bits],
            ]

    def _job_setup(self, m: Module, u: SimpleNamespace) -> None:
        """The steps' loop registers for their next job, set in the `setup` cycle after the last job's
        last step (or `go`): the job's k steps, whether it is the tile's last chunk, whether its C
        rows add to the old ones, and the B^T rows' addresses at its first k step."""
        cfg = self.cfg
        ll = log2(cfg.lanes)
        f, st = u.f, u.stage
        kl = Signal(16)  # the step's k step within its chunk
        chunk_last = Signal()
        acc_now = Signal()  # the chunk's C rows add to the old ones
        bkoff = Signal(20)  # the chunk's first byte in a B^T row
        left = Signal(16)  # k steps from the chunk's first to the tile's end
        m.d.comb += left.eq(st.k_all + 1 - st.kbase)
        steps = Signal(16)
        m.d.comb += steps.eq(Mux(left > st.kc, st.kc, left))
        boff = Signal(20)  # the chunk's first byte in a B^T row: B^T word kb // 2 with half-rate int16
        m.d.comb += boff.eq(Mux(f.a_i16 & ~st.pairstep, st.kbase << (ll - 1), st.kbase << ll))
        with m.If(st.setup):
            m.d.sync += [
                st.setup.eq(0),
                u.k_last.eq(steps - 1),
                u.k_left.eq(steps - 1),
                u.last_k.eq(steps == 1),
                chunk_last.eq(left <= st.kc),
                acc_now.eq(f.accumulate | (st.kbase != 0)),
                kl.eq(0),
                u.kb.eq(st.kbase),
                bkoff.eq(boff),
            ]
            for j, b in enumerate(u.b_addr):
                m.d.sync += b.eq(u.b_row[j] + boff)
        st.kl, st.chunk_last, st.acc_now, st.bkoff = kl, chunk_last, acc_now, bkoff

    def _requests(self, m: Module, u: SimpleNamespace) -> None:
        """Stage 0's operand requests and the stages' hand-over conditions."""
        cfg = self.cfg
        CM, CN, lw, ll = cfg.clusters, cfg.pes_per_cluster, log2(cfg.bus_bytes), log2(cfg.lanes)
        f, last_k, row_ok, col_ok, empty, a_addr = u.f, u.last_k, u.row_ok, u.col_ok, u.empty, u.a_addr
        b_addr, c_addr = u.b_addr, u.c_addr
        # stage 0 asks for one step's operands (and, at the last k step of an accumulating MATMUL,
        # the C rows) until all are granted; stage R registers the lanes' multiplicands the cycle
        # after, and stage P multiplies them into stage 1's product registers (each holding while
        # the next stage is busy); stage 1 accumulates, and at the last k step writes the C rows,
        # holding until the accumulators have taken every row. A step's flags, old C rows and write
        # address follow it along the stages (`follow`).
        vg = Signal()  # a step's operands wait in gather's registers for stage R
        vr = Signal()  # stage R holds a step (its multiplicands)
        v1 = Signal()  # stage 1 holds a step (its products)
        s1_done = Signal()  # ... and finishes with it this cycle
        issuing = Signal()  # stage 0 has steps left to issue
        st = getattr(u, "stage", None)  # A staged in the unit (`_stage`)
        a_ports = st.ports if st else self.a_ports
        ports = list(a_ports) + list(self.b_ports) + list(u.c_rports) + self.a_hi_ports
        issue = issuing
        if st:  # no step while a fill stages the tile's A rows
            issue = Signal()
            m.d.comb += issue.eq(issuing & ~st.busy)
        acc = st.acc_now if st else f.accumulate  # the C rows at the last k step add to the old
        need = []
        for r, port in enumerate(ports):
            nd = Signal(name=f"op_need{r}")
            if r < CM:
                addr = (Mux(st.pairstep, st.kl, st.kl >> 1) if st else a_addr[r][ll:])
                m.d.comb += [port.addr.eq(addr), nd.eq(issue & ~empty & row_ok[r])]
            elif r < CM + CN:
                j = r - CM
                m.d.comb += [port.addr.eq(b_addr[j][ll:]), nd.eq(issue & ~empty & col_ok[j])]
            elif r < 2 * CM + CN:
                i = r - CM - CN
                m.d.comb += port.addr.eq(c_addr[i][lw:])
                m.d.comb += nd.eq(issue & ~empty & last_k & acc & row_ok[i])
            else:  # int16 A at the int8 rate: the step's second A word
                i = r - 2 * CM - CN
                m.d.comb += [port.addr.eq(a_addr[i][ll:] + 1), nd.eq(issue & ~empty & row_ok[i] & f.a_i16)]
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
        # a staged A word is read only while gather's registers can take it, so it needs none
        holds = (True,) * CM if st else ()
        step_done, vals = gather(m, ports, need, issue & ~empty, g_free, holds=holds)
        if st:
            m.d.comb += [p.read.en.eq(g_free) for p in st.ports]
        a_vals, b_vals, c_vals = vals[:CM], vals[CM : CM + CN], vals[CM + CN : 2 * CM + CN]
        u.a_hi_vals = vals[2 * CM + CN :]
        if st:  # a staged pair: both words of an int16 step at the int8 rate, else the step's half
            L8 = 8 * cfg.lanes
            half = Signal()
            with m.If(step_done):
                m.d.sync += half.eq(st.kl[0])
            u.a_hi_vals = [p[L8:] for p in a_vals]
            a_vals = [Mux(st.pairstep, p[:L8], Mux(half, p[L8:], p[:L8])) for p in a_vals]
        u.vg, u.vr, u.v1, u.s1_done, u.issuing, u.s1_free = vg, vr, v1, s1_done, issuing, s1_free
        u.take, u.xfer, u.r_free, u.step_done, u.a_vals = take, xfer, r_free, step_done, a_vals
        u.b_vals, u.c_vals = b_vals, c_vals

    def _multiply(self, m: Module, u: SimpleNamespace) -> None:
        """Stages R, P and 1: the lanes' multiplicands, their products and the accumulators."""
        cfg = self.cfg
        L, CM, CN, ll = cfg.lanes, cfg.clusters, cfg.pes_per_cluster, log2(cfg.lanes)
        f, kb, last_k, last_mb, last_nb, v1 = u.f, u.kb, u.last_k, u.last_mb, u.last_nb, u.v1
        s1_done, take, xfer, step_done, a_vals = u.s1_done, u.take, u.xfer, u.step_done, u.a_vals
        b_vals, c_vals = u.b_vals, u.c_vals
        # lanes past k read as zero (A bytes past the row's k or 2k bytes)
        lane_ok = [Signal(name=f"lane_ok{t}") for t in range(L)]
        upper = Signal()  # int16 A: the step uses the upper half of its B^T word (odd kb)
        full = cfg.a16_full_rate
        for t in range(L):
            with m.If(step_done):
                m.d.sync += lane_ok[t].eq((kb << ll) + t < (f.k if full else f.k << f.a_i16))
        with m.If(step_done):
            m.d.sync += upper.eq(kb[0])
        a_hi_vals = u.a_hi_vals

        # lanes past k multiply zero: their A multiplicands, or with more clusters than PEs (staged
        # A: 8 x 2) their B^T ones, the fewer registers to clear (a product is zero either way)
        mask_b = bool(cfg.a_stage_bytes) and CM > CN

        def ok(t, v):
            return v if mask_b else Mux(lane_ok[t], v, 0)

        def a_elem(i, t):
            """int16 A at the int8 rate: lane t's element, int16 (from the step's first or second A
            word) or int8 (byte t, sign-extended)."""
            h = L // 2
            e16 = (a_vals[i] if t < h else a_hi_vals[i])[16 * (t % h) : 16 * (t % h) + 16]
            e8 = a_vals[i][8 * t : 8 * t + 8].as_signed()
            return ok(t, Mux(f.a_i16, e16.as_signed(), e8))

        def a_lane(v, t):
            """A byte t as a 9-bit multiplicand: signed for int8 A and for an int16 element's high
            byte (odd t), unsigned for its low byte (even t)."""
            byte = v[8 * t : 8 * t + 8]
            ext = byte[7] if t % 2 else byte[7] & ~f.a_i16
            return ok(t, Cat(byte, ext).as_signed())

        def b_lane(v, t):
            """B^T byte of A lane t: byte t, or with int16 A byte t // 2 of the step's half."""
            lo_b, hi_b = t // 2, L // 2 + t // 2
            wide = Mux(upper, v[8 * hi_b : 8 * hi_b + 8], v[8 * lo_b : 8 * lo_b + 8])
            lane = Mux(f.a_i16, wide, v[8 * t : 8 * t + 8]).as_signed()
            return Mux(lane_ok[t], lane, 0) if mask_b else lane

        accs = [[Signal(signed(32), name=f"acc{i}_{j}") for j in range(CN)] for i in range(CM)]
        sums = [[Signal(signed(32), name=f"sum{i}_{j}") for j in range(CN)] for i in range(CM)]
        # stage R: every lane's multiplicands, registered as it takes the step; the old C rows go
        # along to stage 1 (registered at each hand-over, as a stage holds its own step's)
        aw = 16 if full else 9
        a_ops = [[Signal(signed(aw), name=f"a_op{i}_{t}") for t in range(L)] for i in range(CM)]
        b_ops = [[Signal(signed(8), name=f"b_op{j}_{t}") for t in range(L)] for j in range(CN)]
        with m.If(take):
            if full:
                m.d.sync += [a_ops[i][t].eq(a_elem(i, t)) for i in range(CM) for t in range(L)]
                bytes_b = [(j, t, b_vals[j][8 * t : 8 * t + 8].as_signed()) for j in range(CN)
                           for t in range(L)]  # fmt: skip
                if mask_b:
                    bytes_b = [(j, t, Mux(lane_ok[t], v, 0)) for j, t, v in bytes_b]
                m.d.sync += [b_ops[j][t].eq(v) for j, t, v in bytes_b]
            else:
                m.d.sync += [a_ops[i][t].eq(a_lane(a_vals[i], t)) for i in range(CM) for t in range(L)]
                m.d.sync += [b_ops[j][t].eq(b_lane(b_vals[j], t)) for j in range(CN) for t in range(L)]
        old_c = [follow(m, v, [take, xfer], f"old_c{i}") for i, v in enumerate(c_vals)]
        # the step's flags at stage 1: its first k step, its last k step, the instruction's last step
        last_step = Signal()
        st = getattr(u, "stage", None)
        last = last_k & last_nb & last_mb
        m.d.comb += last_step.eq(last & st.chunk_last if st else last)
        if st:  # a chunk's first step starts the sum; its C rows add to the old ones when `acc_now`
            first = st.kl == 0
            kb0_1, last_k1, last1, u.acc1 = follow(
                m, Cat(first, last_k, last_step, st.acc_now), [step_done, take, xfer], "flags"
            )
        else:
            flags = Cat(kb == 0, last_k, last_step)
            kb0_1, last_k1, last1 = follow(m, flags, [step_done, take, xfer], "flags")
            u.acc1 = f.accumulate
        # stage P: the products, registered as stage 1 takes the step. Stage 1 adds them as a
        # balanced tree beside the accumulator's (and the old C row's) sum, so the products pass
        # through log2(lanes) + 1 adders to either register (Fmax).
        bases = [[Signal(signed(32), name=f"base{i}_{j}") for j in range(CN)] for i in range(CM)]
        dots = [[Signal(signed(32), name=f"dot{i}_{j}") for j in range(CN)] for i in range(CM)]
        for i in range(CM):
            for j in range(CN):
                prods = []
                for t in range(L):
                    # int16 A: the odd lanes' products are of high bytes, worth 256 times theirs (the
                    # shift is applied as the product is registered)
                    width = 24 if full else 25 if t % 2 else 17  # 16 x 8 or 9 x 8 bits
                    pr = Signal(signed(width), name=f"prod{i}_{j}_{t}")
                    p = a_ops[i][t] * b_ops[j][t]
                    with m.If(xfer):
                        m.d.sync += pr.eq(Mux(f.a_i16, p << 8, p) if t % 2 and not full else p)
                    prods.append(pr)
                m.d.comb += [
                    dots[i][j].eq(tree(prods)),
                    bases[i][j].eq(Mux(kb0_1, 0, accs[i][j])),
                    sums[i][j].eq(bases[i][j] + dots[i][j]),
                ]
                with m.If(v1 & s1_done):
                    m.d.sync += accs[i][j].eq(sums[i][j])

        u.old_c, u.last_step, u.last_k1, u.last1, u.bases = old_c, last_step, last_k1, last1, bases
        u.dots = dots

    def _write_back(self, m: Module, u: SimpleNamespace) -> None:
        """Stage 1's C row writes at the last k step, and when stage 1 is done with a step."""
        cfg = self.cfg
        CM, CN, lw = cfg.clusters, cfg.pes_per_cluster, log2(cfg.bus_bytes)
        row_ok, col_ok, c_addr, v1, s1_done = u.row_ok, u.col_ok, u.c_addr, u.v1, u.s1_done
        take, xfer, step_done, old_c, last_k1 = u.take, u.xfer, u.step_done, u.old_c, u.last_k1
        bases, dots = u.bases, u.dots
        # write back C rows at the last k step (stage 1)
        written = Signal(CM)  # rows the accumulators took in an earlier cycle of this step
        w_need = []
        for i in range(CM):
            wp = u.c_wports[i]
            # the write's address and row/column masks, from stage 0 along the stages to stage 1
            aw = len(wp.addr)
            w = follow(m, Cat(c_addr[i][lw : lw + aw], row_ok[i], col_ok), [step_done, take, xfer], f"c_w{i}")
            w_row_ok, w_col_ok = w[aw], w[aw + 1 :]
            m.d.comb += wp.addr.eq(w[:aw])
            new = []
            for j in range(CN):
                old = old_c[i][32 * j : 32 * j + 32].as_signed()
                # the old row plus the accumulator, added beside the products' tree (mod 2**32)
                new.append(((Mux(u.acc1, old, 0) + bases[i][j])[:32] + dots[i][j])[:32])
            wn = Signal(name=f"c_wneed{i}")
            m.d.comb += wn.eq(v1 & last_k1 & w_row_ok)
            w_need.append(wn)
            m.d.comb += [
                wp.data.eq(Cat(*new)),
                wp.be.eq(Cat(*[w_col_ok[j].replicate(4) for j in range(CN)])),
                wp.en.eq(wn & ~written[i]),
            ]
        w_granted = Cat(*[p.grant for p in u.c_wports])
        m.d.comb += s1_done.eq(v1 & (written | w_granted | ~Cat(*w_need)).all())
        with m.If(s1_done | ~v1):
            m.d.sync += written.eq(0)
        with m.Else():
            m.d.sync += written.eq(written | (w_granted & Cat(*[p.en for p in u.c_wports])))

    def _handover(self, m: Module, u: SimpleNamespace) -> None:
        """The stages' valid flags, the end of issue and `done`."""
        active, empty, vg, vr, v1, s1_done = u.active, u.empty, u.vg, u.vr, u.v1, u.s1_done
        issuing, s1_free, take, xfer, r_free = u.issuing, u.s1_free, u.take, u.xfer, u.r_free
        step_done, last_step, last1 = u.step_done, u.last_step, u.last1
        # the hand-over to stage 1
        m.d.sync += [
            vg.eq(step_done | (vg & ~r_free)),
            vr.eq(take | (vr & ~s1_free)),
            v1.eq(xfer | (v1 & ~s1_done)),
        ]
        with m.If(issuing & (empty | (step_done & last_step))):
            m.d.sync += issuing.eq(0)
        finished = Signal()
        m.d.comb += finished.eq(active & ((empty & issuing) | (s1_done & last1)))
        m.d.comb += self.exec.done.eq(finished)
        u.finished = finished

    def _loop(self, m: Module, u: SimpleNamespace) -> None:
        """Stage 0's loop, advanced as each step is granted and set up at `go`."""
        cfg = self.cfg
        W, L, CM, CN = cfg.bus_bytes, cfg.lanes, cfg.clusters, cfg.pes_per_cluster
        f, active, nf, n_kb, kb, k_left, k_last = u.f, u.active, u.nf, u.n_kb, u.kb, u.k_left, u.k_last
        last_k, m_rem, n_rem, row_ok, col_ok = u.last_k, u.m_rem, u.n_rem, u.row_ok, u.col_ok
        last_mb, last_nb, empty, a_row, b_row = u.last_mb, u.last_nb, u.empty, u.a_row, u.b_row
        c_row, a_addr, b_addr, c_addr, issuing = u.c_row, u.a_addr, u.b_addr, u.c_addr, u.issuing
        step_done, finished = u.step_done, u.finished
        st = getattr(u, "stage", None)
        # stage 0's loop: k steps, n tiles, m tiles (each compare is against a constant)
        a_mstep, c_mstep = f.a_stride * CM, f.c_stride * CM
        b_nstep = f.b_stride * CN
        with m.If(step_done):
            with m.If(~last_k):
                if cfg.a16_full_rate:  # two A words a step with int16 A
                    a_next, b_next = Mux(f.a_i16, 2 * L, L), L
                else:  # int16 A: B^T word kb // 2
                    a_next, b_next = L, Mux(f.a_i16 & ~kb[0], 0, L)
                m.d.sync += [kb.eq(kb + 1), k_left.eq(k_left - 1), last_k.eq(k_left == 1)]
                m.d.sync += [a.eq(a + a_next) for a in a_addr] + [b.eq(b + b_next) for b in b_addr]
                if st:
                    m.d.sync += st.kl.eq(st.kl + 1)
            with m.Else():
                m.d.sync += [kb.eq(st.kbase if st else 0), k_left.eq(k_last), last_k.eq(k_last == 0)]
                if st:
                    m.d.sync += st.kl.eq(0)
                with m.If(last_nb):
                    m.d.sync += [
                        n_rem.eq(f.n),
                        col_ok.eq(Cat(*[f.n > j for j in range(CN)])),
                        last_nb.eq(f.n <= CN),
                    ]
                    for j in range(CN):
                        first = f.b + times(j, f.b_stride)
                        m.d.sync += [b_row[j].eq(first), b_addr[j].eq(first)]

                    def next_m_tile():
                        m.d.sync += [
                            m_rem.eq(m_rem - CM),
                            row_ok.eq(Cat(*[m_rem > CM + i for i in range(CM)])),
                            last_mb.eq(m_rem <= 2 * CM),
                        ]
                        for i in range(CM):
                            m.d.sync += [
                                a_row[i].eq(a_row[i] + a_mstep),
                                a_addr[i].eq(a_row[i] + a_mstep),
                                c_row[i].eq(c_row[i] + c_mstep),
                                c_addr[i].eq(c_row[i] + c_mstep),
                            ]

                    if st:  # the job's end: the tile's next chunk (same rows), else the next m tile
                        m.d.comb += st.release.eq(1)
                        with m.If(~st.chunk_last):
                            m.d.sync += [st.kbase.eq(st.kbase + st.kc), st.setup.eq(1)]
                            m.d.sync += [c.eq(r) for c, r in zip(c_addr, c_row, strict=True)]
                        with m.Else():
                            next_m_tile()
                            m.d.sync += [st.kbase.eq(0), st.setup.eq(~last_mb)]
                    else:
                        next_m_tile()
                with m.Else():
                    m.d.sync += [
                        n_rem.eq(n_rem - CN),
                        col_ok.eq(Cat(*[n_rem > CN + j for j in range(CN)])),
                        last_nb.eq(n_rem <= 2 * CN),
                    ]
                    m.d.sync += [a.eq(r) for a, r in zip(a_addr, a_row, strict=True)]
                    m.d.sync += [c.eq(c + W) for c in c_addr]
                    for j in range(CN):
                        nxt = b_row[j] + b_nstep
                        m.d.sync += [b_row[j].eq(nxt), b_addr[j].eq(nxt + st.bkoff if st else nxt)]
        with m.If(finished):
            m.d.sync += active.eq(0)
        with m.If(self.exec.go):
            m.d.sync += [
                active.eq(1),
                issuing.eq(1),
                empty.eq((nf.m == 0) | (nf.n == 0)),
                kb.eq(0),
                k_last.eq(n_kb - 1),
                k_left.eq(n_kb - 1),
                last_k.eq(n_kb == 1),
                m_rem.eq(nf.m),
                row_ok.eq(Cat(*[nf.m > i for i in range(CM)])),
                last_mb.eq(nf.m <= CM),
                n_rem.eq(nf.n),
                col_ok.eq(Cat(*[nf.n > j for j in range(CN)])),
                last_nb.eq(nf.n <= CN),
            ]
            for i in range(CM):
                a0, c0 = nf.a + times(i, nf.a_stride), nf.c - ACC_BASE + times(i, nf.c_stride)
                m.d.sync += [a_row[i].eq(a0), a_addr[i].eq(a0), c_row[i].eq(c0), c_addr[i].eq(c0)]
            for j in range(CN):
                b0 = nf.b + times(j, nf.b_stride)
                m.d.sync += [b_row[j].eq(b0), b_addr[j].eq(b0)]
            if st:  # stage the first m tile's rows
                m.d.sync += [st.kbase.eq(0), st.k_all.eq(n_kb - 1), st.setup.eq((nf.m != 0) & (nf.n != 0))]

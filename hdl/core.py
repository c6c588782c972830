"""`NpuCore(config)`: the NPU engine. AXI4 master to DRAM, AXI4-Lite register slave, interrupt.

Inside: the register file, the instruction fetcher, the dispatcher with its dispatch-time checks,
one in-order queue per unit (load, matrix, vector, store), dependency-token counters between every
pair of units, the pause controller, error handling, performance counters, the scratchpad and
accumulator memories, and the four units.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, ResetInserter, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig, get_config
from npu.isa import INSTR_BITS, ErrorCode, Opcode, Unit
from npu.registers import REGISTERS, Status

from .checks import check_instruction
from .common import log2, view
from .fetch import Fetcher, ReadArbiter
from .load import LoadUnit
from .matrix import MatrixUnit
from .regs import RegisterFile, axil_signature
from .spad import Client, SpadPort, onchip_memory
from .store import StoreUnit
from .vector import VectorUnit

UNITS = list(Unit)


def axi_master_signature(cfg: NpuConfig) -> dict:
    W = cfg.bus_bytes
    return {
        "m_axi_arid": Out(4),
        "m_axi_rid": In(4),
        "m_axi_awid": Out(4),
        "m_axi_bid": In(4),
        "m_axi_araddr": Out(32),
        "m_axi_arlen": Out(8),
        "m_axi_arsize": Out(3),
        "m_axi_arburst": Out(2),
        "m_axi_arvalid": Out(1),
        "m_axi_arready": In(1),
        "m_axi_rdata": In(8 * W),
        "m_axi_rresp": In(2),
        "m_axi_rlast": In(1),
        "m_axi_rvalid": In(1),
        "m_axi_rready": Out(1),
        "m_axi_awaddr": Out(32),
        "m_axi_awlen": Out(8),
        "m_axi_awsize": Out(3),
        "m_axi_awburst": Out(2),
        "m_axi_awvalid": Out(1),
        "m_axi_awready": In(1),
        "m_axi_wdata": Out(8 * W),
        "m_axi_wstrb": Out(W),
        "m_axi_wlast": Out(1),
        "m_axi_wvalid": Out(1),
        "m_axi_wready": In(1),
        "m_axi_bresp": In(2),
        "m_axi_bvalid": In(1),
        "m_axi_bready": Out(1),
    }


class NpuCore(wiring.Component):
    def __init__(self, config: NpuConfig | str = "default"):
        self.cfg = get_config(config)
        super().__init__({**axil_signature(), **axi_master_signature(self.cfg), "irq": Out(1)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W = cfg.bus_bytes
        CM, CN = cfg.clusters, cfg.pes_per_cluster

        # ---- registers ---------------------------------------------------------------------------
        m.submodules.regs = regs = RegisterFile(cfg)
        for name in axil_signature():
            a, b = getattr(self, name), getattr(regs, name)
            if regs.signature.members[name].flow == wiring.Out:
                m.d.comb += a.eq(b)
            else:
                m.d.comb += b.eq(a)
        m.d.comb += self.irq.eq(regs.irq_pending & regs.irq_enable)

        # ---- memories ----------------------------------------------------------------------------
        # the scratchpad behind its clients, in priority order per port (hdl/spad.py): the vector
        # unit's reads before the matrix unit's on port A; on port B the vector unit's writes (never
        # refused), then the load unit's writes, then the store unit's reads
        WL = W // cfg.lanes
        clients = [
            *[Client(f"vec_{x}{k}", "A", False) for x in "ab" for k in range(2)],
            *[Client(f"mat_a{i}", "A", False) for i in range(CM)],
            *[Client(f"mat_b{j}", "A", False) for j in range(CN)],
            *[Client(f"vec_w{k}", "B", True) for k in range(2)],
            Client("load", "B", True, lanes=WL),
            Client("store", "B", False, lanes=WL),
        ]
        m.submodules.spad = spad = onchip_memory(cfg, "spad", clients)
        # the accumulators, the same way: port A the matrix unit's C reads, then the vector unit's
        # and the store's; port B the matrix unit's C writes, then the load's
        acc_clients = [
            *[Client(f"mat_c{i}", "A", False) for i in range(CM)],
            *[Client(f"vec_c{k}", "A", False) for k in range(2)],
            Client("store", "A", False),
            *[Client(f"mat_w{i}", "B", True) for i in range(CM)],
            Client("load", "B", True),
        ]
        m.submodules.acc = acc = onchip_memory(cfg, "acc", acc_clients)

        def sp(name):
            return SpadPort(spad, name)

        def ac(name):
            return SpadPort(acc, name)

        # ---- units ----------------------------------------------------------------------------------
        m.submodules.load = load = LoadUnit(cfg, sp("load"), ac("load"))
        m.submodules.matrix = matrix = MatrixUnit(
            cfg,
            [sp(f"mat_a{i}") for i in range(CM)],
            [sp(f"mat_b{j}") for j in range(CN)],
            [ac(f"mat_c{i}") for i in range(CM)],
            [ac(f"mat_w{i}") for i in range(CM)],
        )
        m.submodules.vector = vector = VectorUnit(
            cfg,
            [sp("vec_a0"), sp("vec_a1")],
            [sp("vec_b0"), sp("vec_b1")],
            [ac("vec_c0"), ac("vec_c1")],
            [sp("vec_w0"), sp("vec_w1")],
        )
        m.submodules.store = store = StoreUnit(cfg, sp("store"), ac("store"))
        units = {Unit.LOAD: load, Unit.MATRIX: matrix, Unit.VECTOR: vector, Unit.STORE: store}

        # ---- AXI master --------------------------------------------------------------------------
        m.submodules.fetch = fetch = Fetcher(cfg)
        m.submodules.rarb = rarb = ReadArbiter(cfg)
        size = log2(W)
        m.d.comb += [
            self.m_axi_arsize.eq(size),
            self.m_axi_arburst.eq(1),
            self.m_axi_awsize.eq(size),
            self.m_axi_awburst.eq(1),
            self.m_axi_araddr.eq(rarb.m_araddr),
            self.m_axi_arlen.eq(rarb.m_arlen),
            self.m_axi_arvalid.eq(rarb.m_arvalid),
            rarb.m_arready.eq(self.m_axi_arready),
            rarb.m_rvalid.eq(self.m_axi_rvalid),
            rarb.m_rlast.eq(self.m_axi_rlast),
            rarb.m_rdata.eq(self.m_axi_rdata),
            self.m_axi_rready.eq(rarb.m_rready),
            self.m_axi_awaddr.eq(store.aw.payload.addr),
            self.m_axi_awlen.eq(store.aw.payload.len),
            self.m_axi_awvalid.eq(store.aw.valid),
            store.aw.ready.eq(self.m_axi_awready),
            self.m_axi_wdata.eq(store.w.payload.data),
            self.m_axi_wstrb.eq(store.w.payload.strb),
            self.m_axi_wlast.eq(store.w.payload.last),
            self.m_axi_wvalid.eq(store.w.valid),
            store.w.ready.eq(self.m_axi_wready),
            store.b_valid.eq(self.m_axi_bvalid),
            self.m_axi_bready.eq(store.b_ready),
        ]
        wiring.connect(m, fetch.ar, rarb.ar0)
        wiring.connect(m, rarb.r0, fetch.r)
        wiring.connect(m, load.ar, rarb.ar1)
        wiring.connect(m, rarb.r1, load.r)

        # ---- run state -------------------------------------------------------------------------------
        status = Signal(5, init=int(Status.IDLE))
        m.d.comb += regs.status.eq(status)
        running = Signal()
        m.d.comb += running.eq(status == int(Status.RUNNING))
        halting = Signal()  # dispatch stopped; discard queues, wait for units, then stop
        halt_status = Signal(5)
        halt_code = Signal(8)
        halt_pc = Signal(32)
        resetting = Signal()  # soft reset waiting for units to finish
        flush = Signal()
        cp_id = Signal(32)
        error_code = Signal(8)
        error_pc = Signal(32)
        m.d.comb += [regs.cp_id.eq(cp_id), regs.error_code.eq(error_code), regs.error_pc.eq(error_pc)]

        # ---- queues and tokens ------------------------------------------------------------------------
        qw = INSTR_BITS + 32 + 16  # instruction, pc, cancellation-point ordinal
        queues = {}
        for u in UNITS:
            q = fifo.SyncFIFO(width=qw, depth=cfg.queue_depth)
            queues[u] = q
            m.submodules[f"q_{u.name.lower()}"] = ResetInserter(flush)(q)
        tok = {
            (p, c): Signal(8, name=f"tok_{p.name.lower()}_{c.name.lower()}")
            for p in UNITS
            for c in UNITS
            if p != c
        }
        push = {k: Signal(name=f"push_{k[0].name.lower()}_{k[1].name.lower()}") for k in tok}
        pop = {k: Signal(name=f"pop_{k[0].name.lower()}_{k[1].name.lower()}") for k in tok}
        overflow = Signal()
        overflow_pc = Signal(32)

        # cancellation points: a marker goes into every queue; a unit passes a marker in one cycle
        # unless a pending pause targets it, then it parks there until every unit has arrived
        passed = {u: Signal(16, name=f"passed_{u.name.lower()}") for u in UNITS}
        pause_target = Signal(16)
        target_valid = Signal()
        parked = {}

        unit_busy = {}
        starting = {}
        for u in UNITS:
            q = queues[u]
            unit = units[u]
            head = q.r_data[:INSTR_BITS]
            head_pc = q.r_data[INSTR_BITS : INSTR_BITS + 32]
            head_ord = q.r_data[INSTR_BITS + 32 :]
            wait = head[4:8]
            sig = head[8:12]
            is_sync = head[:4] == int(Opcode.SYNC)
            is_cp = head[:4] == int(Opcode.CANCEL_POINT)
            parked[u] = Signal(name=f"parked_{u.name.lower()}")
            m.d.comb += parked[u].eq(q.r_rdy & is_cp & target_valid & (head_ord == pause_target) & ~unit.busy)
            toks_ok = Const(1, 1)
            for p in UNITS:
                if p != u:
                    toks_ok = toks_ok & (~wait[int(p)] | (tok[(p, u)] != 0) | is_cp)
            start = Signal(name=f"start_{u.name.lower()}")
            m.d.comb += start.eq(
                q.r_rdy
                & toks_ok
                & ~unit.busy
                & running
                & ~halting
                & ~(is_cp & target_valid & (head_ord == pause_target))
            )
            starting[u] = start
            m.d.comb += [q.r_en.eq(start), unit.instr.eq(head), unit.go.eq(start & ~is_sync & ~is_cp)]
            with m.If(start & is_cp):
                m.d.sync += passed[u].eq(passed[u] + 1)
            run_sig = Signal(4, name=f"sig_{u.name.lower()}")
            run_pc = Signal(32, name=f"pc_{u.name.lower()}")
            with m.If(start):
                m.d.sync += [run_sig.eq(sig), run_pc.eq(head_pc)]
            for p in UNITS:
                if p != u:
                    m.d.comb += pop[(p, u)].eq(start & ~is_cp & wait[int(p)])
            for c in UNITS:
                if c != u:
                    sync_push = start & is_sync & sig[int(c)]
                    done_push = unit.done & run_sig[int(c)]
                    m.d.comb += push[(u, c)].eq(sync_push | done_push)
                    with m.If(push[(u, c)] & (tok[(u, c)] >= cfg.token_depth) & ~pop[(u, c)]):
                        m.d.comb += overflow.eq(1)
                        m.d.comb += overflow_pc.eq(Mux(sync_push, head_pc, run_pc))
            unit_busy[u] = Signal(name=f"busy_{u.name.lower()}")
            m.d.comb += unit_busy[u].eq(unit.busy | (start & ~is_cp))
        all_parked = Signal()
        m.d.comb += all_parked.eq(Cat(*[parked[u] for u in UNITS]).all())
        max_passed = passed[UNITS[0]]
        for u in UNITS[1:]:
            max_passed = Mux(passed[u] > max_passed, passed[u], max_passed)
        park_head = queues[Unit.LOAD].r_data
        park_pc = park_head[INSTR_BITS : INSTR_BITS + 32]
        for k, t in tok.items():
            m.d.sync += t.eq(t + push[k] - pop[k])

        all_idle = Signal()
        m.d.comb += all_idle.eq(~Cat(*[unit_busy[u] for u in UNITS]).any())
        queues_empty = Signal()
        m.d.comb += queues_empty.eq(~Cat(*[queues[u].level != 0 for u in UNITS]).any())
        drained = Signal()
        m.d.comb += drained.eq(all_idle & queues_empty)
        tokens_zero = Signal()
        m.d.comb += tokens_zero.eq(~Cat(*[t != 0 for t in tok.values()]).any())

        points = Signal(16)  # cancellation points dispatched in this run
        # ---- dispatcher -------------------------------------------------------------------------------
        instr = fetch.out.payload.instr
        pc = fetch.out.payload.pc
        code = check_instruction(m, instr, cfg)
        opv = instr[:4]
        target = Signal(2)
        is_unit_op = Signal()
        with m.Switch(opv):
            for op, u in (
                (Opcode.LOAD, Unit.LOAD),
                (Opcode.STORE, Unit.STORE),
                (Opcode.MATMUL, Unit.MATRIX),
                (Opcode.VMAP, Unit.VECTOR),
                (Opcode.VADD, Unit.VECTOR),
                (Opcode.POOL, Unit.VECTOR),
            ):
                with m.Case(int(op)):
                    m.d.comb += [target.eq(int(u)), is_unit_op.eq(1)]
            with m.Case(int(Opcode.SYNC)):
                m.d.comb += [target.eq(view(Opcode.SYNC, instr).unit), is_unit_op.eq(1)]
        room = Signal()
        m.d.comb += room.eq(Cat(*[queues[u].w_rdy for u in UNITS]).bit_select(target, 1))
        for u in UNITS:
            m.d.comb += queues[u].w_data.eq(Cat(instr, pc, points + 1))

        pause_req = regs.pause_req
        all_room = Signal()
        m.d.comb += all_room.eq(Cat(*[queues[u].w_rdy for u in UNITS]).all())
        dispatching = Signal()
        stalled = Signal()
        cycles = Signal(64)
        timed_out = Signal()
        m.d.comb += timed_out.eq((regs.timeout != 0) & (cycles >= regs.timeout))
        deadlock_cnt = Signal(2)

        def start_halt(st, c, at_pc):
            m.d.sync += [halting.eq(1), halt_status.eq(st), halt_code.eq(c), halt_pc.eq(at_pc)]

        m.d.comb += fetch.enable.eq(running & ~halting)
        stop_now = Signal()
        with m.If(running & ~halting):
            with m.If(overflow):
                start_halt(int(Status.ERROR), int(ErrorCode.TOKEN), overflow_pc)
            with m.Elif(timed_out):
                start_halt(int(Status.ERROR), int(ErrorCode.TIMEOUT), pc)
            with m.Elif(deadlock_cnt == 3):
                start_halt(int(Status.ERROR), int(ErrorCode.DEADLOCK), pc)
            with m.Elif(fetch.out.valid):
                with m.If(fetch.out.payload.bad):
                    start_halt(int(Status.ERROR), int(ErrorCode.DRAM_RANGE), pc)
                with m.Elif(code != 0):
                    start_halt(int(Status.ERROR), code, pc)
                with m.Elif(is_unit_op):
                    with m.If(room):
                        m.d.comb += dispatching.eq(1)
                        with m.Switch(target):
                            for u in UNITS:
                                with m.Case(int(u)):
                                    m.d.comb += queues[u].w_en.eq(1)
                    with m.Else():
                        m.d.comb += stalled.eq(1)
                with m.Elif(opv == int(Opcode.CANCEL_POINT)):
                    with m.If(all_room):
                        m.d.comb += dispatching.eq(1)
                        m.d.sync += points.eq(points + 1)
                        for u in UNITS:
                            m.d.comb += queues[u].w_en.eq(1)
                    with m.Else():
                        m.d.comb += stalled.eq(1)
                with m.Else():  # END and BARRIER wait for the drain
                    with m.If(drained):
                        m.d.comb += dispatching.eq(1)
                        with m.If(opv == int(Opcode.END)):
                            m.d.comb += stop_now.eq(1)
                            with m.If(tokens_zero):
                                m.d.sync += [status.eq(int(Status.DONE))]
                                m.d.comb += [regs.set_resume_pc.eq(1), regs.new_resume_pc.eq(pc)]
                            with m.Else():
                                m.d.sync += [
                                    status.eq(int(Status.ERROR)),
                                    error_code.eq(int(ErrorCode.TOKEN)),
                                    error_pc.eq(pc),
                                ]
                    with m.Else():
                        m.d.comb += stalled.eq(1)
            # every unit parked at the target point: pause there
            with m.If(all_parked):
                m.d.comb += [stop_now.eq(1), dispatching.eq(0), queues[Unit.LOAD].w_en.eq(0)]
                with m.If(tokens_zero):
                    m.d.sync += [
                        status.eq(int(Status.PAUSED)),
                        cp_id.eq(view(Opcode.CANCEL_POINT, park_head[:INSTR_BITS]).id),
                    ]
                    m.d.comb += [regs.set_resume_pc.eq(1), regs.new_resume_pc.eq(park_pc + 1)]
                with m.Else():
                    m.d.sync += [
                        status.eq(int(Status.ERROR)),
                        error_code.eq(int(ErrorCode.TOKEN)),
                        error_pc.eq(park_pc),
                    ]
        # the pause target: the first point no unit has passed yet
        with m.If(~pause_req):
            m.d.sync += target_valid.eq(0)
        with m.Elif(running & ~target_valid):
            m.d.sync += [target_valid.eq(1), pause_target.eq(max_passed + 1)]
        m.d.comb += fetch.out.ready.eq(dispatching)

        # deadlock: nothing executes, nothing can start, dispatch cannot proceed
        can_start = Cat(*[starting[u] for u in UNITS]).any()
        blocked_dispatch = fetch.out.valid & ~dispatching
        with m.If(running & ~halting & all_idle & ~can_start & ~queues_empty & blocked_dispatch):
            m.d.sync += deadlock_cnt.eq(Mux(deadlock_cnt == 3, 3, deadlock_cnt + 1))
        with m.Else():
            m.d.sync += deadlock_cnt.eq(0)

        # halting: discard queued instructions, wait for in-flight ones
        m.d.comb += flush.eq(halting | (regs.start & ~running))
        with m.If(halting & all_idle):
            m.d.comb += stop_now.eq(1)
            m.d.sync += [
                halting.eq(0),
                status.eq(halt_status),
                error_code.eq(halt_code),
                error_pc.eq(halt_pc),
            ]
            with m.If(resetting):
                m.d.sync += [status.eq(int(Status.IDLE)), error_code.eq(0), error_pc.eq(0), resetting.eq(0)]
        m.d.comb += regs.stop_event.eq(stop_now & ~resetting)
        with m.If(stop_now):
            m.d.comb += regs.consume_pause.eq(1)

        # start / soft reset
        m.d.comb += [
            fetch.restart.eq(regs.start & ~running),
            fetch.base.eq(regs.program_base),
            fetch.start_pc.eq(regs.resume_pc),
        ]
        with m.If(regs.start & ~running):
            m.d.sync += [
                status.eq(int(Status.RUNNING)),
                error_code.eq(0),
                error_pc.eq(0),
                points.eq(0),
                target_valid.eq(0),
            ]
            for u in UNITS:
                m.d.sync += passed[u].eq(0)
            for t in tok.values():
                m.d.sync += t.eq(0)
        with m.If(regs.soft_reset):
            with m.If(running):
                m.d.sync += [halting.eq(1), resetting.eq(1)]
            with m.Else():
                m.d.sync += [status.eq(int(Status.IDLE)), error_code.eq(0), error_pc.eq(0), cp_id.eq(0)]
                for t in tok.values():
                    m.d.sync += t.eq(0)

        # ---- performance counters -------------------------------------------------------------------
        cnt = {r.name: Signal(64, name=f"cnt_{r.name.lower()}") for r in REGISTERS if r.wide}
        for name, s in cnt.items():
            m.d.comb += getattr(regs, f"cnt_{name.lower()}").eq(s)
        m.d.comb += cycles.eq(cnt["CYCLES"])
        with m.If(running):
            m.d.sync += cnt["CYCLES"].eq(cnt["CYCLES"] + 1)
            for u, name in (
                (Unit.LOAD, "BUSY_LOAD"),
                (Unit.MATRIX, "BUSY_MATRIX"),
                (Unit.VECTOR, "BUSY_VECTOR"),
                (Unit.STORE, "BUSY_STORE"),
            ):
                m.d.sync += cnt[name].eq(cnt[name] + unit_busy[u])
            m.d.sync += cnt["STALL_DISPATCH"].eq(cnt["STALL_DISPATCH"] + stalled)
            m.d.sync += cnt["INSTRET"].eq(cnt["INSTRET"] + dispatching)
            lf = view(Opcode.LOAD, queues[Unit.LOAD].r_data[:INSTR_BITS])
            sf = view(Opcode.STORE, queues[Unit.STORE].r_data[:INSTR_BITS])
            ld_go = starting[Unit.LOAD] & (queues[Unit.LOAD].r_data[:4] == int(Opcode.LOAD))
            st_go = starting[Unit.STORE] & (queues[Unit.STORE].r_data[:4] == int(Opcode.STORE))
            with m.If(ld_go):
                m.d.sync += cnt["DMA_RD_BYTES"].eq(cnt["DMA_RD_BYTES"] + lf.rows * lf.cols)
            with m.If(st_go):
                m.d.sync += cnt["DMA_WR_BYTES"].eq(cnt["DMA_WR_BYTES"] + sf.rows * sf.cols)
        with m.If(regs.start & ~running):
            for s in cnt.values():
                m.d.sync += s.eq(0)
        return m

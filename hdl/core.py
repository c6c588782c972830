"""`NpuCore(config)`: the NPU engine. AXI4 master to DRAM, AXI4-Lite register slave, interrupt.

Inside: the register file, the instruction fetcher, the dispatcher with its dispatch-time checks,
one in-order queue per unit (load, matrix, vector, store), dependency-token counters between every
pair of units, the pause controller, error handling, performance counters, the scratchpad and
accumulator memories, and the four units.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, ResetInserter, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from npu.config import NpuConfig, get_config
from npu.isa import ErrorCode, Opcode, Unit
from npu.registers import Status

from .axi import AxiLiteSignature, AxiSignature, skid_buffer
from .common import QueueEntry, header, log2, view
from .counters import COUNTER_NAMES, PerfCounters
from .dispatch import Dispatcher, UnitQueue
from .fetch import Fetcher, ReadArbiter
from .load import LoadUnit
from .matrix import MatrixUnit
from .pause import PauseControl
from .regs import ADDR_BITS, RegisterFile
from .spad import Client, client_signature, onchip_memory
from .store import StoreUnit
from .tokens import TokenChannels, pair_index
from .vector import VectorUnit

UNITS = list(Unit)

#: a unit queue's slot: the entry and its opcode decoded on the way in (the issue logic reads the
#: head's register, no decoder)
Slot = data.StructLayout({"entry": QueueEntry, "sync": 1, "cp": 1, "fence": 1})


def dram_signature(cfg: NpuConfig) -> AxiSignature:
    """The core's DRAM master: AXI4 as wide as the configuration's bus."""
    return AxiSignature(data_width=8 * cfg.bus_bytes)


def regs_signature() -> AxiLiteSignature:
    return AxiLiteSignature(addr_width=ADDR_BITS)


def spad_clients(cfg: NpuConfig) -> list[Client]:
    """The scratchpad's clients in priority order per port (hdl/spad.py): port A reads (the vector
    unit's, the matrix unit's, then the store unit's), port B writes (the vector unit's, never
    refused, then the load unit's) - one read and one write port per bank, the simple dual-port
    block RAM every FPGA family has. With int16 A at the int8 rate each cluster reads a second A
    word a step: on port A, or where a region's banks are fewer than the clusters' A words
    (`a16_second_port`) on port B, so that two clusters need two banks a region, not four."""
    WL = cfg.bus_bytes // cfg.lanes
    staged = bool(cfg.a_stage_bytes)  # the matrix unit stages A rows through two reads
    ah = cfg.clusters if cfg.a16_full_rate and not staged else 0
    on_a, on_b = (0, ah) if cfg.a16_second_port else (ah, 0)
    return [
        *[Client(f"vec_{x}{k}", "A", False) for x in "ab" for k in range(2)],
        # banked: the store's reads while the DRAM waits on its write beats come before the matrix
        # unit's, whose operand reads can take every bank for a whole MATMUL (`split_urgent`)
        *([Client("store_urgent", "A", False, lanes=WL)] if cfg.spad_banked else []),
        *[Client(f"mat_a{i}", "A", False) for i in range(0 if staged else cfg.clusters)],
        *[Client(f"mat_ah{i}", "A", False) for i in range(on_a)],
        *[Client(f"mat_b{j}", "A", False) for j in range(cfg.pes_per_cluster)],
        # the staging fill after the B^T reads: it runs beside the steps, which go first
        *[Client(f"mat_f{i}", "A", False) for i in range(2 if staged else 0)],
        Client("store", "A", False, lanes=WL),
        *[Client(f"vec_w{k}", "B", True) for k in range(2)],
        Client("load", "B", True, lanes=WL),
        # on port B after the load's writes: a whole MATMUL's reads would otherwise hold the next
        # band's load off their banks (tried: the tinyML CNNs on the `ulx3s32` board took 7-19 %
        # more cycles, docs/boards.md)
        *[Client(f"mat_ah{i}", "B", False) for i in range(on_b)],
    ]


def split_urgent(m: Module, urgent: Signal, hi, lo, words: int, width: int):
    """One read port for a unit over two clients of a memory: `lo` (lowest priority), and `hi` (high
    priority) for a request `lo` refused while `urgent`, asked again through `hi` the next cycle -
    the unit repeats a refused request unchanged. `hi` asks from flip-flops only, so the grants of
    the clients between the two (the matrix unit's) wait on none of the unit's request logic (the
    32-MAC build's critical path ran through it). The words come from the client granted the cycle
    before."""
    port = client_signature(words, width, False).flip().create(path=("store_port",))
    took_hi = Signal()
    retry = Signal()
    retry_addr = Signal.like(port.addr)
    same = Signal()
    m.d.comb += [
        same.eq(port.en & (port.addr == retry_addr)),
        hi.addr.eq(retry_addr),
        lo.addr.eq(port.addr),
        hi.en.eq(retry),
        lo.en.eq(port.en & ~retry),
        port.grant.eq((hi.grant & same) | lo.grant),
        port.data.eq(Mux(took_hi, hi.data, lo.data)),
    ]
    with m.If(port.grant):
        m.d.sync += took_hi.eq(hi.grant)
    with m.If(retry):
        with m.If(hi.grant | ~same):  # served, or no longer asked for (a granted word nobody takes)
            m.d.sync += retry.eq(0)
    with m.Elif(port.en & ~lo.grant & urgent):
        m.d.sync += [retry.eq(1), retry_addr.eq(port.addr)]
    return port


def acc_clients(cfg: NpuConfig) -> list[Client]:
    """The accumulators' clients, the same way: port A the matrix unit's C reads, then the vector
    unit's and the store's; port B the matrix unit's C writes, then the load's."""
    n = cfg.c_ports
    return [
        *[Client(f"mat_c{i}", "A", False) for i in range(n)],
        *[Client(f"vec_c{k}", "A", False) for k in range(2)],
        Client("store", "A", False),
        *[Client(f"mat_w{i}", "B", True) for i in range(n)],
        Client("load", "B", True),
    ]


class NpuCore(wiring.Component):
    """One engine. `bus`: AXI4 master to DRAM; `ctrl`: AXI4-Lite slave of the register map; `irq`."""

    def __init__(self, config: NpuConfig | str = "default"):
        self.cfg = get_config(config)
        super().__init__({"bus": Out(dram_signature(self.cfg)), "ctrl": In(regs_signature()), "irq": Out(1)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W = cfg.bus_bytes
        CM, CN = cfg.clusters, cfg.pes_per_cluster

        # ---- registers ---------------------------------------------------------------------------
        m.submodules.regs = regs = RegisterFile(cfg)
        wiring.connect(m, wiring.flipped(self.ctrl), regs.bus)
        m.d.comb += self.irq.eq(regs.irq_pending & regs.irq_enable)

        # ---- memories ----------------------------------------------------------------------------
        m.submodules.spad = spad = onchip_memory(cfg, "spad", spad_clients(cfg))
        m.submodules.acc = acc = onchip_memory(cfg, "acc", acc_clients(cfg))

        def sp(name):
            return getattr(spad, name)

        staged = bool(cfg.a_stage_bytes)

        def ac(name):
            return getattr(acc, name)

        # ---- units ----------------------------------------------------------------------------------
        m.submodules.load = load = LoadUnit(cfg, sp("load"), ac("load"))
        m.submodules.matrix = matrix = MatrixUnit(
            cfg,
            [sp(f"mat_a{i}") for i in range(0 if staged else CM)],
            [sp(f"mat_b{j}") for j in range(CN)],
            [ac(f"mat_c{i}") for i in range(cfg.c_ports)],
            [ac(f"mat_w{i}") for i in range(cfg.c_ports)],
            [sp(f"mat_ah{i}") for i in range(CM if cfg.a16_full_rate and not staged else 0)],
            [sp(f"mat_f{i}") for i in range(2 if staged else 0)],
        )
        m.submodules.vector = vector = VectorUnit(
            cfg,
            [sp("vec_a0"), sp("vec_a1")],
            [sp("vec_b0"), sp("vec_b1")],
            [ac("vec_c0"), ac("vec_c1")],
            [sp("vec_w0"), sp("vec_w1")],
        )
        if cfg.spad_banked:
            urgent = Signal()
            store_sp = split_urgent(
                m, urgent, sp("store_urgent"), sp("store"), cfg.spad_bytes // cfg.lanes, 8 * cfg.bus_bytes
            )
        else:
            store_sp = sp("store")
        m.submodules.store = store = StoreUnit(cfg, store_sp, ac("store"))
        if cfg.spad_banked:
            m.d.comb += urgent.eq(store.urgent)
        units = {Unit.LOAD: load, Unit.MATRIX: matrix, Unit.VECTOR: vector, Unit.STORE: store}

        # ---- AXI master --------------------------------------------------------------------------
        m.submodules.fetch = fetch = Fetcher(cfg)
        m.submodules.rarb = rarb = ReadArbiter(cfg)
        size = log2(W)
        bus = self.bus
        m.d.comb += [
            bus.arsize.eq(size),
            bus.arburst.eq(1),
            bus.awsize.eq(size),
            bus.awburst.eq(1),
            bus.araddr.eq(rarb.m_araddr),
            bus.arlen.eq(rarb.m_arlen),
            bus.arvalid.eq(rarb.m_arvalid),
            rarb.m_arready.eq(bus.arready),
            rarb.m_rvalid.eq(bus.rvalid),
            rarb.m_rlast.eq(bus.rlast),
            rarb.m_rdata.eq(bus.rdata),
            rarb.m_rresp.eq(bus.rresp),
            fetch.r_err.eq(rarb.r0_err),
            bus.rready.eq(rarb.m_rready),
            bus.awaddr.eq(store.aw.payload.addr),
            bus.awlen.eq(store.aw.payload.len),
            bus.awvalid.eq(store.aw.valid),
            store.aw.ready.eq(bus.awready),
            bus.wdata.eq(store.w.payload.data),
            bus.wstrb.eq(store.w.payload.strb),
            bus.wlast.eq(store.w.payload.last),
            bus.wvalid.eq(store.w.valid),
            store.w.ready.eq(bus.wready),
            store.b_valid.eq(bus.bvalid),
            bus.bready.eq(store.b_ready),
        ]
        wiring.connect(m, fetch.ar, rarb.ar0)
        wiring.connect(m, rarb.r0, fetch.r)
        wiring.connect(m, load.ar, rarb.ar1)
        # a register stage between the arbiter's response and the load unit: the owner FIFO's
        # output and the R handshake otherwise run through the load's segment arithmetic into its
        # byte FIFO in one cycle (the ULX3S's critical path; one cycle more latency, full rate)
        skid_buffer(
            m, rarb.r1.valid, rarb.r1.ready, rarb.r1.payload,
            load.r.valid, load.r.ready, load.r.payload, name="load_r",
        )

        # ---- queues, tokens, pause control, dispatcher, counters -----------------------------------
        flush = Signal()  # discard queued instructions (a halt, or a new run)
        queues = {}
        for u in UNITS:
            q = UnitQueue(Slot.size, cfg.queue_depth)
            queues[u] = q
            m.submodules[f"q_{u.name.lower()}"] = ResetInserter(flush)(q)
        m.submodules.tokens = tokens = TokenChannels(cfg)
        m.submodules.pause = pause = PauseControl()
        m.submodules.dispatch = disp = Dispatcher(cfg)
        m.submodules.counters = counters = PerfCounters()

        status = Signal(Status, init=Status.IDLE)
        m.d.comb += regs.status.eq(status)
        running = Signal()
        m.d.comb += running.eq(status[1])  # STATUS is one-hot: no compare
        assert Status.RUNNING == 1 << 1
        restart = Signal()  # START while stopped: a new run begins
        m.d.comb += restart.eq(regs.start & ~running)
        # the run control, an FSM: ACTIVE (dispatching while RUNNING), HALTING (an error stopped
        # dispatch: discard the queues, wait for the units, then report it) and RESETTING (a soft
        # reset waiting for the units to finish); STATUS is the architectural outcome
        halting = Signal()
        halt_req = Signal()
        reset_req = Signal()
        halt_status = Signal(Status)
        halt_code = Signal(ErrorCode)
        halt_pc = Signal(32)
        resetting = Signal()
        cp_id = Signal(32)
        error_code = Signal(ErrorCode)
        error_pc = Signal(32)
        fault_addr = Signal(32)  # PROTECTION: the first byte of the access outside the window
        halt_fault = Signal(32)
        m.d.comb += [regs.cp_id.eq(cp_id), regs.error_code.eq(error_code), regs.error_pc.eq(error_pc),
                     regs.fault_addr.eq(fault_addr)]  # fmt: skip

        # ---- unit issue: each queue's head starts when its unit is free and its tokens are there;
        # a cancellation-point marker passes in one cycle unless a pause targets it (then it parks)
        overflow = Signal()
        overflow_pc = Signal(32)
        parked = {}
        # FENCE markers each unit has passed; a fence completes when every unit has passed it (a
        # unit passes a marker only when idle: everything before it in that unit is done)
        fence_passed = {u: Signal(16, name=f"fences_{u.name.lower()}") for u in UNITS}
        fences_done = Signal(16)
        fence_event = Signal()
        unit_busy = {}
        starting = {}
        run_pcs = {}  # pc of the instruction each unit runs
        overflow_of = {}  # a channel from this unit overflows
        push_pcs = {}  # the pc of the instruction pushing this unit's tokens
        for u in UNITS:
            q, unit = queues[u], units[u].exec
            slot = data.View(Slot, q.r_data)
            head = slot.entry
            hdr = header(head.instr)
            is_sync, is_cp, is_fence = slot.sync, slot.cp, slot.fence
            is_marker = is_cp | is_fence
            at_target = is_cp & pause.target_valid & (head.ordinal == pause.target)
            parked[u] = Signal(name=f"parked_{u.name.lower()}")
            # parked at the target's marker, or past it with nothing started since (holding)
            m.d.comb += parked[u].eq(((q.r_rdy & at_target) | pause.holding[u]) & ~unit.busy)
            toks_ok = Const(1, 1)
            for p in UNITS:
                if p != u:
                    toks_ok = toks_ok & (~hdr.wait[p] | tokens.nonzero[pair_index(p, u)] | is_marker)
            start = Signal(name=f"start_{u.name.lower()}")
            m.d.comb += start.eq(
                q.r_rdy & toks_ok & ~unit.busy & running & ~halting & ~at_target & ~pause.holding[u]
            )
            starting[u] = start
            m.d.comb += [
                q.r_en.eq(start),
                unit.instr.eq(head.instr),
                unit.go.eq(start & ~is_sync & ~is_marker),
                pause.passing[u].eq(start & is_cp),
                pause.starting[u].eq(start & ~is_cp),
            ]
            run_sig = Signal(4, name=f"sig_{u.name.lower()}")
            run_pc = Signal(32, name=f"pc_{u.name.lower()}")
            run_pcs[u] = run_pc
            with m.If(start):
                m.d.sync += [run_sig.eq(hdr.signal), run_pc.eq(head.pc)]
            with m.If(start & is_fence):
                m.d.sync += fence_passed[u].eq(fence_passed[u] + 1)
            for p in UNITS:
                if p != u:
                    m.d.comb += tokens.pop[pair_index(p, u)].eq(start & ~is_marker & hdr.wait[p])
            overflows = []
            for c in UNITS:
                if c != u:
                    k = pair_index(u, c)
                    sync_push = start & is_sync & hdr.signal[c]
                    done_push = unit.done & run_sig[c]
                    m.d.comb += tokens.push[k].eq(sync_push | done_push)
                    overflows.append(tokens.push[k] & tokens.full[k] & ~tokens.pop[k])
            # a unit pushes either from a SYNC starting (it is idle) or as its instruction finishes
            # (it is busy): the overflow's pc is chosen by registers, not by the push (Fmax)
            overflow_of[u] = Signal(name=f"overflow_{u.name.lower()}")
            m.d.comb += overflow_of[u].eq(Cat(*overflows).any())
            push_pcs[u] = Mux(unit.busy, run_pc, head.pc)
            unit_busy[u] = Signal(name=f"busy_{u.name.lower()}")
            m.d.comb += unit_busy[u].eq(unit.busy | (start & ~is_marker))
        m.d.comb += overflow.eq(Cat(*overflow_of.values()).any())
        for u in UNITS:  # the last unit's pc when several overflow, as in channel order
            with m.If(overflow_of[u]):
                m.d.comb += overflow_pc.eq(push_pcs[u])
        all_parked = Signal()
        m.d.comb += all_parked.eq(Cat(*parked.values()).all())
        load_head = data.View(Slot, queues[Unit.LOAD].r_data)
        park = load_head.entry
        # the last point the load unit passed (every unit passes every point): where the pause
        # stops when the load unit holds past the target rather than parking at its marker
        passed_pc = Signal(32)
        passed_id = Signal(32)
        with m.If(starting[Unit.LOAD] & load_head.cp):
            m.d.sync += [passed_pc.eq(park.pc), passed_id.eq(view(Opcode.CANCEL_POINT, park.instr).id)]
        # no unit busy; a start need not be counted (it is in `unit_busy`): every use is while
        # halting (nothing starts), with the queues empty, or with nothing starting
        all_idle = Signal()
        m.d.comb += all_idle.eq(~Cat(*[units[u].exec.busy for u in UNITS]).any())
        queues_empty = Signal()
        m.d.comb += queues_empty.eq(~Cat(*[q.level != 0 for q in queues.values()]).any())
        m.d.comb += tokens.clear.eq((regs.start | regs.soft_reset) & ~running)
        m.d.comb += [tokens.init.eq(regs.resume_tokens), regs.new_resume_tokens.eq(tokens.counts)]

        # ---- dispatch ------------------------------------------------------------------------------
        pc = fetch.out.payload.pc
        timed_out = Signal()
        # registered from the next cycle's CYCLES and TIMEOUT: the same flag, from a flip-flop (Fmax)
        m.d.sync += timed_out.eq((regs.timeout_next != 0) & (counters.cycles_next >= regs.timeout_next))
        deadlock_cnt = Signal(2)
        m.d.comb += [
            disp.instr.eq(fetch.out.payload.instr),
            disp.code.eq(fetch.out.payload.code),
            disp.pc.eq(pc),
            disp.valid.eq(fetch.out.valid),
            disp.bad.eq(fetch.out.payload.bad),
            disp.fault.eq(fetch.out.payload.fault),
            # not held back by a token overflow (it halts the core: Fmax); see `dropped` below
            disp.enable.eq(running & ~halting & ~timed_out & (deadlock_cnt != 3)),
            disp.room.eq(Cat(*[q.w_rdy for q in queues.values()])),
            disp.drained.eq(all_idle & queues_empty),
            disp.restart.eq(restart),
            fetch.enable.eq(running & ~halting),
        ]
        # once every unit has parked at the target point nothing more is dispatched
        dispatching = Signal()
        m.d.comb += dispatching.eq(disp.dispatching & ~all_parked)
        w_op = header(disp.entry.instr).opcode
        w_slot = Signal(Slot)
        m.d.comb += [
            w_slot.entry.eq(disp.entry),
            w_slot.sync.eq(w_op == Opcode.SYNC),
            w_slot.cp.eq(w_op == Opcode.CANCEL_POINT),
            w_slot.fence.eq(w_op == Opcode.FENCE),
        ]
        for u, q in queues.items():
            m.d.comb += [q.w_data.eq(w_slot), q.w_en.eq(disp.w_en[u] & ~(all_parked & (u == Unit.LOAD)))]
        m.d.comb += fetch.out.ready.eq(dispatching)
        # An instruction taken in a token overflow's cycle goes into a queue the halt discards
        # before anything starts; only the fetch pc has moved past it, so the ring head (read
        # while halting and in ERROR) and INSTRET / STALL_DISPATCH leave it out. (An END waits
        # for every unit idle and the queues empty: no token moves in its cycle.)
        dropped = Signal()
        with m.If(dispatching & overflow):
            m.d.sync += dropped.eq(1)
        with m.If(restart):
            m.d.sync += dropped.eq(0)

        def start_halt(st, c, at_pc):
            m.d.comb += halt_req.eq(1)
            m.d.sync += [halt_status.eq(st), halt_code.eq(c), halt_pc.eq(at_pc)]

        # BUS: the memory answered a LOAD's read beat or a STORE's write with SLVERR/DECERR (a fetch's
        # error travels with the instructions to the dispatcher)
        load_fault = Signal()
        store_fault = Signal()
        m.d.comb += [
            load_fault.eq(rarb.r1.valid & rarb.r1.ready & rarb.r1_err),
            store_fault.eq(bus.bvalid & bus.bready & bus.bresp[1]),
        ]
        # the address a PROTECTION at the head would report: followed until a halt begins, then
        # held (no enable through the halt's priority chain below: Fmax); used only if the halt's
        # code is PROTECTION
        head = fetch.out.payload
        access = Mux(
            head.bad,
            fetch.bad_addr,
            Mux(header(head.instr).opcode == Opcode.STORE, view(Opcode.STORE, head.instr).dram,
                view(Opcode.LOAD, head.instr).dram),
        )  # fmt: skip
        with m.If(~halting):
            m.d.sync += halt_fault.eq(access)
        stop_now = Signal()
        with m.If(running & ~halting):
            with m.If(load_fault | store_fault):
                start_halt(
                    Status.ERROR, ErrorCode.BUS, Mux(load_fault, run_pcs[Unit.LOAD], run_pcs[Unit.STORE])
                )
            with m.Elif(overflow):
                start_halt(Status.ERROR, ErrorCode.TOKEN, overflow_pc)
            with m.Elif(timed_out):
                start_halt(Status.ERROR, ErrorCode.TIMEOUT, pc)
            with m.Elif(deadlock_cnt == 3):
                start_halt(Status.ERROR, ErrorCode.DEADLOCK, pc)
            with m.Elif(disp.error):
                start_halt(Status.ERROR, disp.error_code, pc)
            with m.If(disp.end):  # END with every unit drained: done, unless tokens are left over
                m.d.comb += stop_now.eq(1)
                with m.If(~tokens.any):
                    m.d.sync += status.eq(Status.DONE)
                    m.d.comb += [regs.set_resume_pc.eq(1), regs.new_resume_pc.eq(pc)]
                with m.Else():
                    m.d.sync += [status.eq(Status.ERROR), error_code.eq(ErrorCode.TOKEN), error_pc.eq(pc)]
            # every unit parked at the target point: pause there
            # (tokens pushed before the point for instructions after it stay in the channels; the
            # registers keep their counts for the resume: RESUME_TOKENS)
            with m.If(all_parked):
                m.d.comb += stop_now.eq(1)
                held = pause.holding[Unit.LOAD]
                park_id = Mux(held, passed_id, view(Opcode.CANCEL_POINT, park.instr).id)
                m.d.sync += [status.eq(Status.PAUSED), cp_id.eq(park_id)]
                at = Mux(held, passed_pc, park.pc)
                m.d.comb += [regs.set_resume_pc.eq(1), regs.new_resume_pc.eq(at + 1)]
        m.d.comb += [
            pause.request.eq(regs.pause_req),
            pause.running.eq(running),
            pause.restart.eq(restart),
        ]

        # deadlock: nothing executes, nothing can start, dispatch cannot proceed
        can_start = Cat(*starting.values()).any()
        blocked_dispatch = fetch.out.valid & ~dispatching  # no token moves here: no overflow
        with m.If(running & ~halting & all_idle & ~can_start & ~queues_empty & blocked_dispatch):
            m.d.sync += deadlock_cnt.eq(Mux(deadlock_cnt == 3, 3, deadlock_cnt + 1))
        with m.Else():
            m.d.sync += deadlock_cnt.eq(0)

        # halting: discard queued instructions, wait for in-flight ones
        m.d.comb += flush.eq(halting | restart)
        with m.If(halting & all_idle):
            m.d.comb += stop_now.eq(1)
            m.d.sync += [status.eq(halt_status), error_code.eq(halt_code), error_pc.eq(halt_pc),
                         fault_addr.eq(Mux(halt_code == ErrorCode.PROTECTION, halt_fault, 0))]  # fmt: skip
            with m.If(resetting):
                m.d.sync += [status.eq(Status.IDLE), error_code.eq(0), error_pc.eq(0), fault_addr.eq(0)]
        m.d.comb += regs.stop_event.eq(stop_now & ~resetting)
        with m.If(stop_now):
            m.d.comb += regs.consume_pause.eq(1)

        # start / soft reset
        m.d.comb += [
            fetch.restart.eq(restart),
            fetch.base.eq(Mux(regs.ring_size != 0, regs.ring_base, regs.program_base)),
            fetch.ring_size.eq(regs.ring_size),
            fetch.tail.eq(regs.ring_tail),
            fetch.start_pc.eq(regs.resume_pc),
            fetch.win_base.eq(regs.dram_base),
            fetch.win_limit.eq(regs.dram_limit),
            # the command ring: FENCE completions, WAITING, the count of the next instruction
            regs.fence_event.eq(fence_event),
            regs.waiting.eq(running & ~halting & fetch.empty & all_idle & queues_empty),
            regs.ring_head.eq(
                Mux(
                    status == Status.IDLE,
                    0,
                    Mux((status == Status.PAUSED) | (status == Status.DONE), regs.resume_pc, pc - dropped),
                )
            ),
        ]
        m.d.comb += fence_event.eq(Cat(*[(fence_passed[u] - fences_done)[:16] != 0 for u in UNITS]).all())
        with m.If(fence_event):
            m.d.sync += fences_done.eq(fences_done + 1)
        with m.If(restart):
            m.d.sync += [status.eq(Status.RUNNING), error_code.eq(0), error_pc.eq(0), fault_addr.eq(0)]
            # markers dropped by an error or a pause are fetched again: count from the completed fences
            m.d.sync += [fence_passed[u].eq(fences_done + fence_event) for u in UNITS]
        with m.If(regs.soft_reset):
            with m.If(running):
                m.d.comb += reset_req.eq(1)
            with m.Else():
                m.d.sync += [status.eq(Status.IDLE), error_code.eq(0), error_pc.eq(0), cp_id.eq(0),
                             fault_addr.eq(0)]  # fmt: skip
        with m.FSM(name="run") as run:
            with m.State("ACTIVE"):
                with m.If(reset_req):
                    m.next = "RESETTING"
                with m.Elif(halt_req):
                    m.next = "HALTING"
            with m.State("HALTING"):
                with m.If(reset_req):
                    m.next = "RESETTING"
                with m.Elif(all_idle):
                    m.next = "ACTIVE"
            with m.State("RESETTING"):
                with m.If(all_idle & ~reset_req):
                    m.next = "ACTIVE"
        # plain expressions of the state (not assignments inside the states): an event-driven
        # simulator such as Icarus evaluates them at time 0 even though the state never changes
        m.d.comb += [
            halting.eq(run.ongoing("HALTING") | run.ongoing("RESETTING")),
            resetting.eq(run.ongoing("RESETTING")),
        ]

        # ---- performance counters -------------------------------------------------------------------
        ld = data.View(Slot, queues[Unit.LOAD].r_data).entry
        st = data.View(Slot, queues[Unit.STORE].r_data).entry
        lf, sf = view(Opcode.LOAD, ld.instr), view(Opcode.STORE, st.instr)
        ld_go = starting[Unit.LOAD] & (header(ld.instr).opcode == Opcode.LOAD)
        st_go = starting[Unit.STORE] & (header(st.instr).opcode == Opcode.STORE)
        m.d.comb += [
            counters.running.eq(running),
            counters.restart.eq(restart),
            counters.busy.eq(Cat(*unit_busy.values())),
            counters.stalled.eq(disp.stalled & ~overflow),
            counters.retired.eq(dispatching & ~overflow),
            counters.rd_bytes.eq(Mux(ld_go, lf.rows * lf.cols, 0)),
            counters.wr_bytes.eq(Mux(st_go, sf.rows * sf.cols, 0)),
        ]
        for name in COUNTER_NAMES:
            m.d.comb += getattr(regs, f"cnt_{name.lower()}").eq(getattr(counters, name.lower()))
        return m

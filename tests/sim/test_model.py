"""The golden model through its registers: runs, errors, pause/resume and timing rules."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu.arith import round_up
from npu.compiler.programs import gemm_program, gemm_reference, gemm_requant
from npu.config import ACC_BASE, get_config
from npu.isa import ErrorCode, Opcode, Unit, encode, encode_program, make
from npu.registers import REG, RESUME_TOKEN_REGS, Control, Status, unpack_tokens
from npu.sim.golden.model import NpuModel
from npu.timing import duration
from tests.sim.helpers import DATA_BASE, assert_done, read, run_instrs

TINY, DEFAULT = get_config("tiny"), get_config("default")


def raw_run(cfg, instrs, **kw):
    return run_instrs(cfg, instrs, build=False, **kw)


# -- errors: every condition the ISA names ends in its error code, never a hang ----------------------


def test_illegal_opcode():
    m = NpuModel(TINY)
    m.load_program(encode(make("load", rows=1, cols=4)) + bytes([0xE] + [0] * 31), 0)
    m.start()
    assert m.run() == Status.ERROR
    assert m.error_code == ErrorCode.ILLEGAL_OPCODE and m.error_pc == 1
    assert m.read_reg(REG["ERROR_CODE"].offset) == ErrorCode.ILLEGAL_OPCODE
    assert m.read_reg(REG["ERROR_PC"].offset) == 1


def test_illegal_field_reserved_bits():
    word = int.from_bytes(encode(make("barrier")), "little") | (1 << 255)
    m = NpuModel(TINY)
    m.load_program(word.to_bytes(32, "little"), 0)
    m.start()
    assert m.run() == Status.ERROR and m.error_code == ErrorCode.ILLEGAL_FIELD


@pytest.mark.parametrize(
    "ins,code",
    [
        (make("vmap", rows=1, cols=1, lo=3, hi=2), ErrorCode.ILLEGAL_FIELD),
        (make("matmul", a=2, m=1, n=1, k=1, c=ACC_BASE), ErrorCode.MISALIGNED),
        (make("load", spad=TINY.spad_bytes, rows=1, cols=1), ErrorCode.SPAD_RANGE),
        (make("store", spad=ACC_BASE + TINY.acc_bytes - 2, rows=1, cols=4), ErrorCode.SPAD_RANGE),
        (
            make("load", dram=TINY.dram_bytes - 8, rows=2, cols=8, dram_stride=8, spad_stride=8),
            ErrorCode.DRAM_RANGE,
        ),
    ],
)
def test_dispatch_time_errors(ins, code):
    # an earlier valid instruction in flight when the error is found still completes
    first = make("load", spad=0, dram=DATA_BASE, rows=1, cols=16, spad_stride=16, dram_stride=16)
    x = np.arange(16, dtype=np.uint8)
    m = raw_run(TINY, [first, ins, make("end")], dram={DATA_BASE: x})
    assert m.status == Status.ERROR and m.error_code == code and m.error_pc == 1
    assert m.chip.spad[:16].tolist() == x.tolist()


def test_fetch_outside_dram():
    m = NpuModel(TINY)
    body = encode(make("load", rows=1, cols=4))
    m.load_program(body, TINY.dram_bytes - 32)  # no END: the next fetch runs off DRAM
    m.start()
    assert m.run() == Status.ERROR and m.error_code == ErrorCode.DRAM_RANGE and m.error_pc == 1


def test_deadlock_token_never_pushed():
    ins = make("matmul", m=1, n=1, k=8, c=ACC_BASE, wait=[Unit.LOAD])
    m = raw_run(TINY, [ins, make("end")])
    assert m.status == Status.ERROR and m.error_code == ErrorCode.DEADLOCK


def test_token_outstanding_at_end():
    m = raw_run(TINY, [make("load", rows=1, cols=4, signal=[Unit.MATRIX]), make("end")])
    assert m.status == Status.ERROR and m.error_code == ErrorCode.TOKEN and m.error_pc == 1


def test_token_overflow():
    cfg = TINY.replace(token_depth=2)
    ld = make("load", rows=1, cols=4, signal=[Unit.MATRIX])
    m = raw_run(cfg, [ld, ld, ld, make("end")])
    assert m.status == Status.ERROR and m.error_code == ErrorCode.TOKEN and m.error_pc == 2


def _crossing_program():
    # the load's token for the MATMUL crosses the point
    return [
        make("load", rows=1, cols=4, signal=[Unit.MATRIX]),
        make("cancel_point", id=7),
        make("matmul", m=1, n=1, k=4, c=ACC_BASE, wait=[Unit.LOAD]),
        make("end"),
    ]


def test_a_pause_keeps_the_tokens_that_cross_its_point():
    m = NpuModel(TINY)
    m.load_program(encode_program(_crossing_program()), 0)
    m.start(pause=True)
    assert m.run() == Status.PAUSED and m.cp_id == 7 and m.resume_pc == 2
    words = [m.read_reg(REG[n].offset) for n in RESUME_TOKEN_REGS]
    assert unpack_tokens(words) == {(Unit.LOAD, Unit.MATRIX): 1}
    m.start()  # a plain resume: START loads them back
    assert m.run() == Status.DONE
    assert [m.read_reg(REG[n].offset) for n in RESUME_TOKEN_REGS] == [0, 0, 0]


def test_a_resume_without_its_tokens_deadlocks_and_with_them_is_done():
    m = NpuModel(TINY)
    m.load_program(encode_program(_crossing_program()), 0)
    m.start(pause=True)
    assert m.run() == Status.PAUSED
    saved = [m.read_reg(REG[n].offset) for n in RESUME_TOKEN_REGS]
    for n in RESUME_TOKEN_REGS:  # another program runs in between: the host clears them first
        m.write_reg(REG[n].offset, 0)
    m.start(pc=2)
    assert m.run() == Status.ERROR and m.error_code == ErrorCode.DEADLOCK
    m.soft_reset()
    m.load_program(encode_program(_crossing_program()), 0)
    for n, w in zip(RESUME_TOKEN_REGS, saved, strict=True):
        m.write_reg(REG[n].offset, w)
    m.start(pc=2)
    assert m.run() == Status.DONE


def _held_program():
    # the load unit passes the point at once and its next load waits for the long MATMUL before it
    return [
        make("load", rows=1, cols=4, signal=[Unit.MATRIX]),
        make("matmul", m=64, n=16, k=64, c=ACC_BASE, wait=[Unit.LOAD], signal=[Unit.LOAD]),
        make("cancel_point", id=7),
        make("load", spad=64, rows=1, cols=4, wait=[Unit.MATRIX]),
        make("end"),
    ]


def test_a_pause_stops_at_a_point_a_unit_passed_while_nothing_after_it_has_started():
    """Asked while the MATMUL runs, the load unit has passed the point and started nothing since (its
    load waits for the MATMUL): the pause stops at that point, not at the next (there is none: the
    run would end DONE), with the MATMUL's token for the load kept for the resume."""
    m = NpuModel(TINY)
    m.load_program(encode_program(_held_program()), 0)
    m.start()
    m.advance(duration(_held_program()[0], TINY) + 40)  # the MATMUL runs
    assert m.status == Status.RUNNING and m._run.passed[Unit.LOAD] == 1 and m._run.passed[Unit.MATRIX] == 0
    m.request_pause()
    assert m.run() == Status.PAUSED and m.cp_id == 7 and m.resume_pc == 3
    assert unpack_tokens(list(m.resume_tokens)) == {(Unit.MATRIX, Unit.LOAD): 1}
    m.start()
    assert m.run() == Status.DONE
    # asked once the load after the point has started, the pause has no point left to stop at
    m = NpuModel(TINY, trace=True)
    m.load_program(encode_program(_held_program()), 0)
    m.start()
    m.advance_until_target(2)
    started = [e.start for e in m.trace if e.pc == 3 and e.unit == "load"]
    assert started and started[0] <= m.now
    m.request_pause()
    assert m.run() == Status.DONE


def test_timeout_register():
    x = np.zeros(64, np.uint8)
    instrs = [make("load", spad=0, dram=DATA_BASE, rows=64, cols=64, spad_stride=64, dram_stride=0)] * 4
    m = NpuModel(TINY)
    m.write_reg(REG["TIMEOUT"].offset, 100)
    m = run_instrs(TINY, instrs, {DATA_BASE: x}, model=m)
    assert m.status == Status.ERROR and m.error_code == ErrorCode.TIMEOUT
    # dispatch stops at cycle 100; the load in flight then finishes
    assert 100 <= m.counter_values()["CYCLES"] <= 100 + duration(instrs[0], TINY)


def test_recovery_by_soft_reset_after_error():
    m = raw_run(TINY, [make("load", spad=ACC_BASE - 1, rows=1, cols=1), make("end")])
    assert m.status == Status.ERROR and m.irq_pending
    m.write_reg(REG["CONTROL"].offset, int(Control.SOFT_RESET))
    assert m.status == Status.IDLE and m.error_code == ErrorCode.NONE
    x = np.arange(8, dtype=np.uint8)
    m = run_instrs(
        TINY,
        [
            make("load", spad=0, dram=DATA_BASE, rows=1, cols=8, spad_stride=8, dram_stride=8),
            make("store", spad=0, dram=0x8000, rows=1, cols=8, spad_stride=8, dram_stride=8),
        ],
        {DATA_BASE: x},
        model=m,
    )
    assert_done(m)
    assert read(m, 0x8000, (8,), np.uint8).tolist() == x.tolist()


# -- registers ------------------------------------------------------------------------------------


def test_identity_registers_and_irq():
    m = NpuModel(DEFAULT)
    assert m.read_reg(REG["CONFIG_ID"].offset) == DEFAULT.config_id
    assert m.read_reg(REG["ID"].offset) == 0x3155504E
    m.write_reg(REG["ID"].offset, 0)  # read-only: ignored
    assert m.read_reg(REG["ID"].offset) == 0x3155504E
    m.write_reg(REG["CONTROL"].offset, int(Control.IRQ_ENABLE))
    m.load_program(encode(make("end")), 0)
    m.write_reg(REG["CONTROL"].offset, int(Control.START | Control.IRQ_ENABLE))
    assert m.read_reg(REG["STATUS"].offset) == Status.RUNNING
    assert not m.irq
    m.run()
    assert m.read_reg(REG["STATUS"].offset) == Status.DONE and m.irq
    m.write_reg(REG["IRQ"].offset, 1)
    assert not m.irq


# -- the GEMM example: bit-exact, and pausing at every cancellation point changes nothing ---------------


def _gemm_setup(cfg, m_, n_, k_, cancel_every, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m_, k_), dtype=np.int8)
    bt = rng.integers(-128, 128, (n_, k_), dtype=np.int8)
    mult, shift = gemm_requant(k_)
    A, B, C = 0x4000, 0x4000 + m_ * k_, 0x4000 + m_ * k_ + n_ * k_
    P = round_up((C + m_ * n_), 32)
    prog = gemm_program(
        cfg, m_, n_, k_, A, B, C, mult=mult, shift=shift, relu=True, cancel_every=cancel_every
    )
    model = NpuModel(cfg)
    model.write_dram(A, a)
    model.write_dram(B, bt)
    model.load_program(encode_program(prog.instrs), P)
    ref = gemm_reference(a, bt, mult=mult, shift=shift, relu=True)
    return model, prog, ref, C


@pytest.mark.parametrize(
    "cfg,shape",
    [(TINY, (24, 20, 72)), (DEFAULT, (200, 96, 300)), (DEFAULT, (256, 256, 256))],
    ids=["tiny", "default", "256"],
)
def test_gemm_bit_exact(cfg, shape):
    model, prog, ref, C = _gemm_setup(cfg, *shape, cancel_every=0)
    model.start()
    assert model.run() == Status.DONE
    assert np.array_equal(read(model, C, ref.shape), ref)
    cyc = model.counter_values()
    ideal = shape[0] * shape[1] * shape[2] / cfg.macs_per_cycle
    assert cyc["CYCLES"] >= ideal
    assert cyc["BUSY_MATRIX"] >= ideal


@pytest.mark.parametrize(
    "cfg,shape", [(TINY, (60, 24, 72)), (DEFAULT, (200, 96, 300))], ids=["tiny", "default"]
)
def test_pause_at_every_cancellation_point(cfg, shape):
    ref_model, prog, ref, C = _gemm_setup(cfg, *shape, cancel_every=1)
    assert len(prog.cancel_points) >= 2
    ref_model.start()
    assert ref_model.run() == Status.DONE
    whole_cycles = ref_model.counter_values()["CYCLES"]

    model, *_ = _gemm_setup(cfg, *shape, cancel_every=1)
    model.start(pause=True)
    seen = []
    while model.run() == Status.PAUSED:
        cp = model.read_reg(REG["CP_ID"].offset)
        pc = model.read_reg(REG["RESUME_PC"].offset)
        assert prog.cancel_points[cp] == pc - 1
        seen.append(cp)
        model.start(pc=pc, pause=True)
    assert model.status == Status.DONE
    assert seen == sorted(prog.cancel_points)
    assert np.array_equal(model.dram, ref_model.dram)
    # pausing for each point alone, then resuming, gives identical DRAM too
    for cp in sorted(prog.cancel_points):
        model, *_ = _gemm_setup(cfg, *shape, cancel_every=1)
        model.start(pause=True)
        while model.run() == Status.PAUSED and model.cp_id != cp:
            model.start(pc=model.resume_pc, pause=True)
        assert model.status == Status.PAUSED and model.cp_id == cp
        model.start(pc=model.resume_pc)
        assert model.run() == Status.DONE
        assert np.array_equal(model.dram, ref_model.dram)
    assert whole_cycles > 0


@settings(max_examples=25)
@given(st.lists(st.integers(0, 60_000), min_size=1, max_size=4))
def test_pause_at_random_cycles(cycles):
    ref_model, prog, ref, C = _gemm_setup(DEFAULT, 200, 96, 300, cancel_every=1)
    ref_model.start()
    ref_model.run()
    model, *_ = _gemm_setup(DEFAULT, 200, 96, 300, cancel_every=1)
    model.start()
    for at in sorted(cycles):
        if model.status != Status.RUNNING:
            break
        model.advance(max(0, at - model.counter_values()["CYCLES"]))
        if model.status != Status.RUNNING:
            break
        model.request_pause()
        st_ = model.run()
        if st_ == Status.PAUSED:
            model.start(pc=model.resume_pc)
    model.run()
    assert model.status == Status.DONE
    assert np.array_equal(model.dram, ref_model.dram)


def test_pause_without_points_runs_to_done():
    model, prog, ref, C = _gemm_setup(TINY, 24, 20, 72, cancel_every=0)
    model.start(pause=True)
    assert model.run() == Status.DONE
    assert np.array_equal(read(model, C, ref.shape), ref)
    assert not model.read_reg(REG["CONTROL"].offset) & Control.PAUSE


def test_cancel_point_without_pause_costs_only_its_dispatch_slot():
    """A point that is not taken is a no-op: removing the points (keeping the builder's SYNCs,
    which are the price of having no token outstanding there) saves at most their dispatch slots."""
    with_cp, prog, _, _ = _gemm_setup(DEFAULT, 200, 96, 300, cancel_every=1)
    without, *_ = _gemm_setup(DEFAULT, 200, 96, 300, cancel_every=1)
    stripped = [i for i in prog.instrs if i.op != Opcode.CANCEL_POINT]
    without.write_dram(without.program_base, encode_program(stripped))
    for m in (with_cp, without):
        m.start()
        assert m.run() == Status.DONE
    a, b = with_cp.counter_values()["CYCLES"], without.counter_values()["CYCLES"]
    assert 0 <= a - b <= len(prog.cancel_points) * DEFAULT.instr_beats


# -- timing rules ---------------------------------------------------------------------------------


def test_units_overlap_and_tokens_serialise():
    """Independent loads and matmuls run concurrently; a token makes them wait."""
    ld = make("load", spad=0, dram=DATA_BASE, rows=64, cols=64, spad_stride=64, dram_stride=64)
    mm = make(
        "matmul",
        a=4096,
        b=4096,
        c=ACC_BASE,
        m=16,
        n=16,
        k=64,
        a_stride=64,
        b_stride=64,
        c_stride=DEFAULT.acc_row_bytes * 4,
    )
    d_ld, d_mm = duration(ld, DEFAULT), duration(mm, DEFAULT)
    par = raw_run(DEFAULT, [ld, mm, make("end")])
    ser = raw_run(
        DEFAULT, [ld.with_tokens(0, 1 << Unit.MATRIX), mm.with_tokens(1 << Unit.LOAD, 0), make("end")]
    )
    assert_done(par)
    assert_done(ser)
    t_par, t_ser = par.counter_values()["CYCLES"], ser.counter_values()["CYCLES"]
    assert t_ser - t_par >= min(d_ld, d_mm) - DEFAULT.instr_beats - 1
    assert par.counter_values()["BUSY_LOAD"] == d_ld and par.counter_values()["BUSY_MATRIX"] == d_mm


def test_matmul_duration_rule():
    cfg = DEFAULT
    mm = make("matmul", m=33, n=17, k=65, c=ACC_BASE, a_stride=72, b_stride=72, c_stride=80)
    want = cfg.matrix_latency + 9 * 5 * 9
    assert duration(mm, cfg) == want

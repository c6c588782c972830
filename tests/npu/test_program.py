"""The program builder's tokens express every dependency: parallel execution == sequential."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu.config import ACC_BASE, get_config
from npu.isa import ErrorCode, IsaError, Opcode, Unit, encode_program, make, strided_apart, validate
from npu.program import ProgramBuilder, check_tokens, split_misaligned, start_order, token_syncs
from npu.registers import Status
from npu.sim.golden.model import NpuModel
from npu.sim.rtl.randprog import random_program, sequential_reference

CFGS = {"tiny": get_config("tiny"), "default": get_config("default")}


def run_random(cfg, seed, **kw):
    rp = random_program(cfg, seed, **kw)
    m = NpuModel(cfg)
    for addr, arr in rp.dram.items():
        m.write_dram(addr, arr)
    m.load_program(encode_program(rp.program.instrs), rp.prog_base)
    return rp, m


@pytest.mark.parametrize("name", CFGS)
@settings(max_examples=60)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_programs_match_sequential_execution(name, seed):
    cfg = CFGS[name]
    rp, m = run_random(cfg, seed)
    check_tokens(rp.program.instrs, cfg)
    m.start()
    assert m.run() == Status.DONE, (seed, m.error_code)
    dram, chip = sequential_reference(cfg, rp)
    assert np.array_equal(
        m.dram[rp.out_base : rp.out_base + rp.out_bytes], dram[rp.out_base : rp.out_base + rp.out_bytes]
    ), f"seed {seed}"
    assert np.array_equal(m.chip.spad, chip.spad) and np.array_equal(m.chip.acc, chip.acc), f"seed {seed}"


@pytest.mark.parametrize("name", CFGS)
@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_programs_pause_at_every_point(name, seed):
    cfg = CFGS[name]
    rp, ref = run_random(cfg, seed, cp_prob=0.3)
    ref.start()
    assert ref.run() == Status.DONE
    _, m = run_random(cfg, seed, cp_prob=0.3)
    m.start(pause=True)
    stops = 0
    while m.run() == Status.PAUSED:
        stops += 1
        m.start(pc=m.resume_pc, pause=True)
    assert m.status == Status.DONE
    assert stops == len(rp.program.cancel_points)
    assert np.array_equal(m.dram, ref.dram)


@pytest.mark.parametrize("name", CFGS)
@settings(max_examples=40)
@given(seed=st.integers(0, 2**32 - 1))
def test_start_order_keeps_the_values_and_each_units_order(name, seed):
    """A random program's unit instructions in the order they can start (npu.program.start_order,
    what the compiler does between cancellation points), tokens assigned again: the same DRAM and
    on-chip state as executing the original program one instruction at a time, every unit's own
    instructions in their original order, and no more cycles than the original."""
    cfg = CFGS[name]
    rp = random_program(cfg, seed)
    instrs = [i.with_tokens(0, 0) for i in rp.program.instrs if i.unit is not None and i.op != Opcode.SYNC]
    order = start_order(instrs, cfg)
    assert sorted(order) == list(range(len(instrs)))
    for u in Unit:
        mine = [k for k in order if instrs[k].unit == u]
        assert mine == sorted(mine), f"seed {seed}: {u.name} reordered"

    def run(seq):
        b = ProgramBuilder(cfg)
        for ins in seq:
            b.add(ins)
        m = NpuModel(cfg)
        for addr, arr in rp.dram.items():
            m.write_dram(addr, arr)
        m.load_program(encode_program(b.build().instrs), rp.prog_base)
        m.start()
        assert m.run() == Status.DONE, (seed, m.error_code)
        return m

    m, before = run([instrs[k] for k in order]), run(instrs)
    dram, chip = sequential_reference(cfg, rp)
    out = slice(rp.out_base, rp.out_base + rp.out_bytes)
    assert np.array_equal(m.dram[out], dram[out]), f"seed {seed}"
    assert np.array_equal(m.chip.spad, chip.spad) and np.array_equal(m.chip.acc, chip.acc), f"seed {seed}"
    assert m.counter_values()["CYCLES"] <= before.counter_values()["CYCLES"] * 1.05, seed


def test_builder_emits_tokens_for_a_raw_dependency_only():
    cfg = CFGS["tiny"]
    b = ProgramBuilder(cfg)
    b.add("load", spad=0, dram=0x100, rows=1, cols=16, spad_stride=16, dram_stride=16)
    b.add("load", spad=64, dram=0x100, rows=1, cols=16, spad_stride=16, dram_stride=16)
    b.add("matmul", a=0, b=0, c=ACC_BASE, m=1, n=1, k=16, a_stride=16, b_stride=16, c_stride=8)
    prog = b.build().instrs
    assert prog[0].signal == 1 << Unit.MATRIX and prog[1].signal == 0
    assert prog[2].wait == 1 << Unit.LOAD
    assert prog[-1].op == Opcode.END


def test_check_tokens_rejects_bad_programs():
    cfg = CFGS["tiny"]
    with pytest.raises(IsaError) as e:
        check_tokens([make("matmul", c=ACC_BASE, wait=[Unit.LOAD]), make("end")], cfg)
    assert e.value.code == ErrorCode.DEADLOCK
    with pytest.raises(IsaError) as e:
        check_tokens([make("load", signal=[Unit.MATRIX]), make("fence")], cfg)
    assert e.value.code == ErrorCode.TOKEN
    # a token may cross a cancellation point (a pause keeps it: RESUME_TOKENS)
    crossing = [make("load", signal=[Unit.MATRIX]), make("cancel_point", id=1)]
    check_tokens([*crossing, make("matmul", c=ACC_BASE, wait=[Unit.LOAD]), make("end")], cfg)


def test_token_syncs_push_the_counts_back():
    counts = {(Unit.LOAD, Unit.MATRIX): 2, (Unit.LOAD, Unit.STORE): 1, (Unit.VECTOR, Unit.LOAD): 1}
    syncs = token_syncs(counts)
    assert [(s.op, s.unit) for s in syncs] == [(Opcode.SYNC, Unit.LOAD)] * 2 + [(Opcode.SYNC, Unit.VECTOR)]
    pushed: dict = {}
    for s in syncs:
        assert s.wait == 0
        for c in Unit:
            if s.signal >> c & 1:
                pushed[(s.unit, c)] = pushed.get((s.unit, c), 0) + 1
    assert pushed == counts


def test_duplicate_cancel_point_id():
    b = ProgramBuilder(CFGS["tiny"])
    b.cancel_point(1)
    with pytest.raises(ValueError, match="used twice"):
        b.cancel_point(1)


def test_drain_holds_every_unit_at_the_point_until_all_have_finished_before_it():
    """Without `drain` the load unit passes the point while the MATMUL before it still runs (a
    pause asked then waits for the next point); with it no unit passes before the MATMUL ends."""
    from npu.sim.golden.runner import timing_run

    cfg = CFGS["tiny"]
    first_pass = {}
    for drained in (False, True):
        b = ProgramBuilder(cfg)
        b.add("load", spad=0, dram=0x100, rows=1, cols=16, spad_stride=16, dram_stride=16)
        b.add("matmul", a=0, b=0, c=ACC_BASE, m=16, n=16, k=16, a_stride=0, b_stride=0, c_stride=64)
        if drained:
            b.drain()
        b.cancel_point(1)
        b.add("load", spad=512, dram=0x200, rows=1, cols=16, spad_stride=16, dram_stride=16)
        prog = b.build()
        m = timing_run(cfg, prog.instrs, trace=True)
        mm_end = max(e.end for e in m.trace if e.op == "matmul")
        passes = [e.start for e in m.trace if e.op == "pass_point"]
        first_pass[drained] = (min(passes), mm_end)
    assert first_pass[False][0] < first_pass[False][1]  # the load unit ran ahead
    assert first_pass[True][0] >= first_pass[True][1]


@settings(max_examples=300)
@given(
    stride=st.integers(1, 48),
    a=st.integers(0, 300),
    b=st.integers(0, 300),
    wa=st.integers(1, 60),
    wb=st.integers(1, 60),
    ra=st.integers(1, 6),
    rb=st.integers(1, 6),
)
def test_strided_apart_never_separates_accesses_that_share_a_byte(stride, a, b, wa, wb, ra, rb):
    bytes_a = {a + i * stride + j for i in range(ra) for j in range(wa)}
    bytes_b = {b + i * stride + j for i in range(rb) for j in range(wb)}
    if strided_apart(a, wa, b, wb, stride):
        assert not bytes_a & bytes_b


def test_channel_slices_of_one_tensor_need_no_token():
    """A STORE of channels [0, 16) of an HWC tensor (64-byte pixels) and a LOAD of channels
    [16, 32): their bounding spans overlap, their bytes do not; channels [8, 24) do share bytes."""
    cfg = CFGS["default"]
    b = ProgramBuilder(cfg)
    b.add("store", spad=0, dram=0x1000, rows=8, cols=16, spad_stride=16, dram_stride=64)
    b.add("load", spad=4096, dram=0x1010, rows=8, cols=16, spad_stride=16, dram_stride=64)
    b.add("load", spad=8192, dram=0x1008, rows=8, cols=16, spad_stride=16, dram_stride=64)
    prog = b.build().instrs
    assert prog[1].wait == 0
    assert prog[2].wait == 1 << Unit.STORE


@settings(max_examples=60)
@given(
    op=st.sampled_from(["vmap", "vmap_i32", "vmul", "vadd"]),
    off=st.integers(0, 15),
    rows=st.integers(1, 3),
    cols=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_builder_splits_unaligned_wide_vector_operands(op, off, rows, cols, seed):
    """On `default` an int16 or int32 operand whose steps take two words must be word-aligned; the
    builder splits an instruction with an unaligned one into legal pieces with the same result."""
    from npu.sim.golden.kernels import OnChip, execute

    cfg = CFGS["default"]
    i16 = {"dst_i16": 1}
    pitch = 2 * cols + 2 * off + 16
    if op == "vmap":
        ins = make("vmap", src=off, dst=4096 + off, rows=rows, cols=cols, src_stride=pitch, dst_stride=pitch,
                   mult=1 << 29, shift=30, src_i16=1, **i16)  # fmt: skip
    elif op == "vmap_i32":
        ins = make("vmap", src=ACC_BASE + 4 * off, dst=4096 + off, rows=rows, cols=cols, src_stride=4 * pitch,
                   dst_stride=pitch, mult=1 << 29, shift=36, src_type=1, **i16)  # fmt: skip
    elif op == "vmul":
        ins = make("vmul", a=off, b=2048, dst=4096 + off, rows=rows, cols=cols, a_stride=pitch, b_stride=0,
                   dst_stride=pitch, mult=1 << 20, shift=27, a_i16=1, **i16)  # fmt: skip
    else:
        ins = make("vadd", a=off, b=2048 + 2 * off, dst=4096 + off, len=rows * cols, mult_a=1 << 14,
                   mult_b=3 << 12, shift=14, a_i16=1, b_i16=1, **i16)  # fmt: skip
    pieces = split_misaligned(ins, cfg)
    for p in pieces:
        validate(p, cfg)
    rng = np.random.default_rng(seed)
    chips = []
    for run in ([ins], pieces):
        chip = OnChip(cfg)
        chip.spad[:] = rng.integers(0, 256, cfg.spad_bytes, dtype=np.uint8) if not chips else chips[0][1]
        chip.acc[:] = rng.integers(0, 256, cfg.acc_bytes, dtype=np.uint8) if not chips else chips[0][2]
        start = (chip.spad.copy(), chip.acc.copy())
        for i in run:
            execute(chip, np.zeros(16, np.uint8), i)
        chips.append((chip, *start))
    assert np.array_equal(chips[0][0].spad, chips[1][0].spad)

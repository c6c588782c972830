"""The bank-conflict analysis counts what a banked scratchpad would serve per MATMUL step."""

import numpy as np

from npu.config import get_config
from npu.isa import make
from npu.sim.golden.banks import mappings, matmul_step_cycles, program_conflicts

CFG = get_config("default")  # 4 clusters, 4 PEs, 8 lanes, 8 banks
L = CFG.lanes


def _cycles(ins, mapping="modulo"):
    banks, fn, split = mappings(CFG)[mapping]
    return matmul_step_cycles(ins, CFG, banks, fn, np.random.default_rng(0), split=split)


def test_conflict_free_layout_takes_one_cycle_per_step():
    # A rows on even banks (base even, stride 2 lane words mod 8), B^T rows on odd banks
    ins = make("matmul", a=0, b=L, c=0x80000, m=8, n=8, k=64, a_stride=10 * L, b_stride=10 * L, c_stride=32)
    steps, cycles = _cycles(ins)
    assert steps == 2 * 2 * 8 and cycles == steps


def test_rows_in_one_bank_serialise():
    # strides of 8 lane words put all four A rows in one bank and all four B^T rows in another
    ins = make("matmul", a=0, b=L, c=0x80000, m=4, n=4, k=8, a_stride=8 * L, b_stride=8 * L, c_stride=16)
    assert _cycles(ins) == (1, 4.0)
    # the same bank for A and B^T: all eight reads in one bank
    ins = make("matmul", a=0, b=64 * L, c=0x80000, m=4, n=4, k=8, a_stride=8 * L, b_stride=8 * L, c_stride=16)
    assert _cycles(ins) == (1, 8.0)
    # the skewed mapping spreads power-of-B strides over consecutive banks
    assert _cycles(ins, "skewed")[1] < 8.0
    # split groups: A and B^T never share a bank; 5 banks per group hold 4 rows at stride 8 apart
    assert _cycles(ins, "split-prime") == (1, 1.0)


def test_rows_past_m_and_n_are_not_read():
    ins = make("matmul", a=0, b=64 * L, c=0x80000, m=1, n=1, k=8, a_stride=8 * L, b_stride=8 * L, c_stride=16)
    assert _cycles(ins) == (1, 2.0)


def test_program_totals():
    prog = [
        make("matmul", a=0, b=L, c=0x80000, m=4, n=4, k=8, a_stride=8 * L, b_stride=8 * L, c_stride=16),
        make("matmul", a=0, b=L, c=0x80000, m=8, n=8, k=64, a_stride=10 * L, b_stride=10 * L, c_stride=32),
    ]
    r = program_conflicts(prog, CFG)
    assert r["matmuls"] == 2 and r["steps"] == 1 + 32
    assert r["mappings"]["modulo"]["cycles"] == 4 + 32

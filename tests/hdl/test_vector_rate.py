"""The vector unit on the RTL takes `vector_lanes` elements a step whether they are int8 or int16:
each instruction's busy cycles match the golden model's timing, and int16 costs what int8 does.
Where an int16 step takes two lane words (`default`'s 8 lanes: npu.isa.wide_operands), its
operands are word-aligned, as the compiler places them."""

import numpy as np
import pytest

from npu.config import get_config
from npu.isa import encode_program
from npu.program import ProgramBuilder
from npu.sim.rtl.core import RtlJob, compare, run_model, run_rtl

pytestmark = pytest.mark.rtl

ROWS = 6


def _cols(cfg) -> int:
    """A ragged last step in every row; a multiple of 4 where int16 steps take two lane words
    (a pool's pixel pitch must then be word-aligned)."""
    return 44 if 2 * cfg.vector_lanes > cfg.lanes else 45
SRC, SRC_B, DST = 0x1000, 0x3000, 0x6000


def _job(cfg, what: str, e: int) -> RtlJob:
    """One vector instruction of `what` over ROWS x COLS elements of `e` bytes, between a LOAD of
    its operands and a STORE of its result."""
    COLS = _cols(cfg)
    i16 = {"a_i16": 1, "b_i16": 1, "dst_i16": 1} if e == 2 else {}
    row = COLS * e + 8  # row pitch in bytes: not a lane multiple where steps take one word
    b = ProgramBuilder(cfg)
    for spad, dram in ((0, SRC), (0x1000, SRC_B)):
        b.add("load", spad=spad, dram=dram, rows=ROWS, cols=row, spad_stride=row, dram_stride=row)
    if what == "vmap":
        f = {"src_i16": 1, "dst_i16": 1} if e == 2 else {}
        b.add("vmap", src=0, dst=0x2000, rows=ROWS, cols=COLS, src_stride=row, dst_stride=row,
              mult=(1 << 30) + 7, shift=30, zp_in=3, zp_out=-2, lo=-100, hi=110, **f)  # fmt: skip
    elif what == "vadd":
        b.add("vadd", a=0, b=0x1000, dst=0x2000, len=ROWS * COLS, mult_a=1 << 14, mult_b=-(1 << 13),
              shift=14, zp_a=1, zp_b=-1, zp_out=2, lo=-128, hi=127, **i16)  # fmt: skip
    elif what == "vmul":
        b.add("vmul", a=0, b=0x1000, dst=0x2000, rows=ROWS, cols=COLS, a_stride=row, b_stride=row,
              dst_stride=row, mult=1 << 20, shift=27, zp_a=-5, zp_b=9, zp_out=3, lo=-128, hi=127,
              **i16)  # fmt: skip
    else:  # a 2 x 2 average pool of COLS channels
        f = {"src_i16": 1, "dst_i16": 1} if e == 2 else {}
        b.add("pool", src=0, dst=0x2000, in_w=3, channels=COLS, kh=2, kw=2, sh=1, sw=1,
              out_h=1, out_w=2, mode=1, mult=1 << 29, shift=31, lo=-128, hi=127, **f)  # fmt: skip
    b.add("store", spad=0x2000, dram=DST, rows=ROWS, cols=row, spad_stride=row, dram_stride=row)
    rng = np.random.default_rng(len(what) * e)
    data = {a: rng.integers(0, 256, ROWS * row, dtype=np.uint8).tobytes() for a in (SRC, SRC_B)}
    return RtlJob(f"{what}-{8 * e}", encode_program(b.build().instrs), 0x8000, dram=data, window=0x8000)


@pytest.mark.parametrize("config", ["tiny", "default"])
def test_int16_vector_steps_take_as_many_elements_as_int8(config):
    cfg = get_config(config)
    jobs = [_job(cfg, what, e) for what in ("vmap", "vadd", "vmul", "pool") for e in (1, 2)]
    busy = {}
    for job, rec in zip(jobs, run_rtl(cfg, jobs), strict=True):
        model = run_model(cfg, job)
        assert model.status == "DONE", (job.name, model.status, model.error_code)
        assert not compare(model, rec), (job.name, compare(model, rec))
        got, want = rec.counters["BUSY_VECTOR"], model.counters["BUSY_VECTOR"]
        assert abs(got - want) <= 0.05 * want + 2, (job.name, got, want)
        busy[job.name] = got
    for what in ("vmap", "vadd", "vmul", "pool"):
        assert busy[f"{what}-16"] <= 1.1 * busy[f"{what}-8"] + 2, (what, busy)

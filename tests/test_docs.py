"""docs/ stays true: generated tables are current and the worked examples hold on the model."""

import numpy as np

from npu import docgen
from npu.asm import assemble
from npu.config import get_config
from npu.isa import encode
from tests.sim.helpers import DATA_BASE, assert_done, read, run_instrs


def test_generated_tables_are_current():
    for name in docgen.SECTIONS:
        text = (docgen.DOCS / name).read_text()
        assert docgen.render(name, text) == text, "run: python -m npu.docgen"


def test_encoding_example():
    ins = assemble(
        "load spad=0x100 dram=0x1000 rows=4 cols=16 spad_stride=16 dram_stride=32 signal=matrix"
    ).instrs[0]
    assert encode(ins)[:16].hex(" ") == "02 02 00 01 00 00 01 00 40 00 00 01 00 01 00 20"
    assert "`02 02 00 01 00 00 01 00 40 00 00 01 00 01 00 20" in (docgen.DOCS / "isa.md").read_text()


def test_load_padding_example():
    cfg = get_config("tiny")
    prog = assemble(
        f"load spad=0 dram={DATA_BASE} rows=2 cols=3 spad_stride=5 dram_stride=3 pad_left=1 "
        "pad_right=1 pad_top=1 pad_value=-1\n"
        "store spad=0 dram=0x8000 rows=1 cols=15 spad_stride=15 dram_stride=15\n"
    ).instrs
    m = run_instrs(cfg, prog, {DATA_BASE: np.arange(1, 7, dtype=np.int8)})
    assert_done(m)
    assert read(m, 0x8000, (15,)).tolist() == [-1] * 5 + [-1, 1, 2, 3, -1, -1, 4, 5, 6, -1]


def test_vmap_and_matmul_examples():
    cfg = get_config("tiny")
    x = np.array([1000], np.int32)
    prog = assemble(
        f"load spad=0x80000 dram={DATA_BASE} rows=1 cols=4 spad_stride=4 dram_stride=4\n"
        "vmap src=0x80000 dst=0 rows=1 cols=1 src_type=i32 mult=3 shift=4 zp_out=-10\n"
        f"load spad=0x40 dram={DATA_BASE + 4} rows=1 cols=2 spad_stride=4 dram_stride=2\n"
        f"load spad=0x80 dram={DATA_BASE + 6} rows=1 cols=2 spad_stride=4 dram_stride=2\n"
        "matmul a=0x40 b=0x80 c=0x80010 m=1 n=1 k=2 a_stride=4 b_stride=4 c_stride=8\n"
        "store spad=0 dram=0x8000 rows=1 cols=1 spad_stride=1 dram_stride=1\n"
        "store spad=0x80010 dram=0x8004 rows=1 cols=4 spad_stride=4 dram_stride=4\n"
    ).instrs
    data = np.concatenate([x.view(np.int8), np.array([3, -4, 5, 6], np.int8)])
    m = run_instrs(cfg, prog, {DATA_BASE: data})
    assert_done(m)
    assert read(m, 0x8000, (1,))[0] == 127
    assert read(m, 0x8004, (1,), np.int32)[0] == -9

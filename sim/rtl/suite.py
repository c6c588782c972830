"""The differential RTL-vs-model job suite: directed edge cases, error programs, random programs and
pause scenarios. Used by tests/hdl/test_core_rtl.py and by `npu hdl replay`.
"""

from __future__ import annotations

import numpy as np

from npu.arith import round_up
from npu.config import ACC_BASE, NpuConfig
from npu.isa import Instr, Opcode, Unit, encode, encode_program, make, misaligned_operands, wide_operands
from npu.program import ProgramBuilder
from npu.sim.rtl.core import RtlJob
from npu.sim.rtl.randprog import random_program

DATA = 0x1000
OUT = 0x3000
PROG = 0x6000
WINDOW = 0x8000


def _data(seed: int, n: int = 0x2000) -> dict[int, bytes]:
    return {DATA: np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()}


def _built(cfg: NpuConfig, name: str, instrs: list[Instr], seed: int = 0, **kw) -> RtlJob:
    b = ProgramBuilder(cfg)
    for i in instrs:
        b.add(_word_aligned_pool(i, cfg))
    return RtlJob(name, encode_program(b.build().instrs), PROG, _data(seed), window=WINDOW, **kw)


def _word_aligned_pool(i: Instr, cfg: NpuConfig) -> Instr:
    """A pool whose steps take two words of an operand at an unaligned address or pixel pitch on
    `cfg` (npu.isa.wide_operands; the builder splits every other vector instruction so) with its
    operands moved up to the word and its channels rounded up to whole words: the edge cases of
    the narrower configurations, as `default`'s 8 lanes allow them."""
    if i.op != Opcode.POOL or not misaligned_operands(i, cfg):
        return i
    f = dict(i.fields)
    for name, _, word in wide_operands(i, cfg):
        f[name] = round_up(f[name], word)
        f["channels"] = round_up(f["channels"], word // (2 if f[f"{name}_i16"] else 1))
    return Instr(i.op, f)


def _raw(name: str, instrs: list[Instr | bytes], **kw) -> RtlJob:
    blob = b"".join(i if isinstance(i, bytes) else encode(i) for i in instrs)
    return RtlJob(name, blob, PROG, _data(1), window=WINDOW, **kw)


def store_all(spad: int, n: int, dram: int = OUT) -> Instr:
    """One row of n bytes from on-chip `spad` to DRAM."""
    return make("store", spad=spad, dram=dram, rows=1, cols=n, spad_stride=n, dram_stride=n)


def load_all(spad: int, n: int, dram: int = DATA) -> Instr:
    """One row of n bytes from DRAM to on-chip `spad`."""
    return make("load", spad=spad, dram=dram, rows=1, cols=n, spad_stride=n, dram_stride=n)


def directed_jobs(cfg: NpuConfig) -> list[RtlJob]:
    """Every instruction type with its edge cases."""
    W, L, R = cfg.bus_bytes, cfg.lanes, cfg.acc_row_bytes
    A = ACC_BASE
    jobs = []

    # LOAD: zero sizes, padding only, misaligned ends, stride 0, accumulator destination
    jobs.append(
        _built(
            cfg,
            "load_zero",
            [
                make("load", spad=0, dram=DATA, rows=0, cols=5, spad_stride=5),
                make("load", spad=0, dram=DATA, rows=3, cols=0, spad_stride=5),
                store_all(0, 64),
            ],
        )
    )
    jobs.append(
        _built(
            cfg,
            "load_pad_only",
            [
                make(
                    "load",
                    spad=3,
                    rows=0,
                    cols=0,
                    pad_top=3,
                    pad_left=5,
                    pad_right=2,
                    spad_stride=9,
                    pad_value=-7,
                ),
                store_all(0, 64),
            ],
        )
    )
    jobs.append(
        _built(
            cfg,
            "load_padded_misaligned",
            [
                make(
                    "load",
                    spad=5,
                    dram=DATA + 3,
                    rows=7,
                    cols=19,
                    spad_stride=29,
                    dram_stride=23,
                    pad_top=2,
                    pad_bottom=1,
                    pad_left=3,
                    pad_right=4,
                    pad_value=-128,
                ),
                store_all(0, 400),
            ],
        )
    )
    jobs.append(
        _built(
            cfg,
            "load_stride0_acc",
            [
                make(
                    "load",
                    spad=A + 4,
                    dram=DATA + 1,
                    rows=5,
                    cols=2 * W + 3,
                    spad_stride=2 * W + 3,
                    dram_stride=0,
                ),
                store_all(A, 5 * (2 * W + 3) + 8),
            ],
        )
    )
    # rows starting inside the last bus word before a 4 KiB boundary: the first burst is one beat
    # (a burst of zero beats hung both DMA units)
    jobs.append(
        _built(
            cfg,
            "dma_unaligned_at_4k",
            [
                make(
                    "load",
                    spad=0,
                    dram=DATA + 0xFFE,
                    rows=2,
                    cols=W + 5,
                    spad_stride=W + 5,
                    dram_stride=0x1001,
                ),
                make(
                    "store",
                    spad=0,
                    dram=OUT + 0xFFD,
                    rows=2,
                    cols=W + 5,
                    spad_stride=W + 5,
                    dram_stride=0x1002,
                ),
            ],
        )
    )
    # long rows: bursts split at 256 beats and at 4 KiB boundaries
    n = min(cfg.spad_bytes // 2, 256 * W + 3 * W + 5)
    jobs.append(
        _built(
            cfg,
            "load_long_rows",
            [
                make(
                    "load",
                    spad=0,
                    dram=DATA + 0xFF0,
                    rows=1,
                    cols=min(n, 0x1010),
                    spad_stride=n,
                    dram_stride=0,
                ),
                store_all(0, min(n, 0x1010), dram=OUT),
            ],
        )
    )
    # STORE: from accumulators, misaligned, overlapping DRAM rows
    jobs.append(
        _built(
            cfg,
            "store_acc_misaligned",
            [
                make("load", spad=A, dram=DATA, rows=1, cols=256, spad_stride=256, dram_stride=256),
                make(
                    "store",
                    spad=A + 3,
                    dram=OUT + 5,
                    rows=6,
                    cols=W + 7,
                    spad_stride=W + 9,
                    dram_stride=W + 1,
                ),
            ],
        )
    )
    # MATMUL: k = 0, ragged m/n/k, accumulate, extreme values
    for name, (m, n, k, acc, lo) in {
        "mm_k0_acc": (3, 2 * cfg.pes_per_cluster + 1, 0, 1, -128),
        "mm_k0_init": (3, 5, 0, 0, -128),
        "mm_ragged": (2 * cfg.clusters + 1, cfg.pes_per_cluster + 3, 3 * L + 5, 1, -128),
        "mm_extreme": (cfg.clusters, cfg.pes_per_cluster, 4 * L, 0, -128),
    }.items():
        ks = round_up(max(k, 1), L)
        cs = round_up(4 * n, R)
        val = np.full(m * ks, lo, np.int8).tobytes() if name == "mm_extreme" else None
        instrs = [
            make("load", spad=0, dram=DATA, rows=m, cols=k, spad_stride=ks, dram_stride=k) if k else None,
            make("load", spad=2048, dram=DATA + 512, rows=n, cols=k, spad_stride=ks, dram_stride=k)
            if k
            else None,
            make("load", spad=A, dram=DATA + 1024, rows=m, cols=4 * n, spad_stride=cs, dram_stride=4 * n),
            make(
                "matmul",
                a=0,
                b=2048,
                c=A,
                m=m,
                n=n,
                k=k,
                a_stride=ks,
                b_stride=ks,
                c_stride=cs,
                accumulate=acc,
            ),
            make("store", spad=A, dram=OUT, rows=m, cols=4 * n, spad_stride=cs, dram_stride=4 * n),
        ]
        job = _built(cfg, name, [i for i in instrs if i is not None], seed=len(name))
        if val is not None:
            job.dram[DATA] = bytes([0x80]) * 2048  # all -128: the largest products
        jobs.append(job)
    # VMAP: int32 saturation at both ends, shift 62, in-place int8, zero rows
    jobs.append(
        _built(
            cfg,
            "vmap_i32_saturate",
            [
                make("load", spad=A, dram=DATA, rows=1, cols=256, spad_stride=256, dram_stride=256),
                make(
                    "vmap",
                    src=A,
                    dst=0,
                    rows=4,
                    cols=13,
                    src_stride=64,
                    dst_stride=16,
                    src_type=1,
                    mult=-(2**31),
                    shift=0,
                    zp_out=5,
                ),
                make(
                    "vmap",
                    src=A + 4,
                    dst=100,
                    rows=3,
                    cols=11,
                    src_stride=68,
                    dst_stride=11,
                    src_type=1,
                    mult=2**31 - 1,
                    shift=62,
                    zp_out=-3,
                    lo=-100,
                    hi=90,
                ),
                make("vmap", src=A, dst=200, rows=0, cols=11, src_stride=68, dst_stride=11, src_type=1),
                store_all(0, 256),
            ],
        )
    )
    jobs.append(
        _built(
            cfg,
            "vmap_i8_inplace",
            [
                make("load", spad=8, dram=DATA, rows=1, cols=200, spad_stride=200, dram_stride=200),
                make(
                    "vmap",
                    src=8,
                    dst=8,
                    rows=5,
                    cols=37,
                    src_stride=40,
                    dst_stride=40,
                    mult=-3,
                    shift=1,
                    zp_in=-128,
                    zp_out=127,
                    lo=-128,
                    hi=127,
                ),
                store_all(0, 256),
            ],
        )
    )
    # per-column VMAP: int32 accumulators with one multiplier and shift per column (shifts past 62
    # act as 62), unaligned parameters; an int8 source in place
    mults = np.random.default_rng(5).integers(-(2**20), 2**20, 40).astype("<i4")
    shifts = np.random.default_rng(6).integers(14, 30, 40).astype(np.uint8)
    mults[:3] = (-(2**31), 2**31 - 1, 0)
    shifts[:6] = (63, 63, 62, 62, 0, 40)  # 63 acts as 62 (visible with the extreme multipliers)
    jobs.append(
        RtlJob(
            "vmap_per_column",
            encode_program(_per_col_program(cfg, A)),
            PROG,
            {DATA: np.random.default_rng(7).integers(0, 256, 0x1000, dtype=np.uint8).tobytes(),
             DATA + 0x1000: mults.tobytes() + shifts.tobytes()},
            window=WINDOW,
        )
    )
    # VMUL: a broadcast row (squeeze-excite gating), a full second operand, in place, empty
    jobs.append(
        _built(
            cfg,
            "vmul_broadcast_full_inplace",
            [
                make("load", spad=0, dram=DATA, rows=1, cols=1024, spad_stride=1024, dram_stride=1024),
                make("vmul", a=1, b=900, dst=1100, rows=5, cols=37, a_stride=40, b_stride=0, dst_stride=37,
                     mult=1 << 20, shift=27, zp_a=-5, zp_b=100, zp_out=3),
                make("vmul", a=300, b=503, dst=300, rows=4, cols=45, a_stride=50, b_stride=50, dst_stride=50,
                     mult=-(1 << 30) - 7, shift=36, zp_a=127, zp_b=-128, zp_out=-2, lo=-100, hi=90),
                make("vmul", a=0, b=0, dst=0, rows=3, cols=0, a_stride=9, b_stride=9, dst_stride=9),
                store_all(0, 1024),
                store_all(1024, 512, OUT + 1024),
            ],
        )
    )
    # VLUT: every input value through a random table (both unaligned); in place, with the table
    # overwritten by its own output (read whole first); empty
    jobs.append(
        _built(
            cfg,
            "vlut_all_values",
            [
                make("load", spad=0, dram=DATA, rows=1, cols=1024, spad_stride=1024, dram_stride=1024),
                make("vlut", src=3, dst=700, rows=4, cols=64, src_stride=70, dst_stride=64, table=301),
                make("vlut", src=5, dst=5, rows=3, cols=19, src_stride=21, dst_stride=21, table=600),
                make("vlut", src=40, dst=610, rows=2, cols=33, src_stride=33, dst_stride=33, table=600),
                make("vlut", src=0, dst=0, rows=0, cols=9, src_stride=9, dst_stride=9, table=0),
                store_all(0, 1024),
            ],
        )
    )
    jobs.append(
        _built(
            cfg,
            "vadd_edges",
            [
                make("load", spad=0, dram=DATA, rows=1, cols=512, spad_stride=512, dram_stride=512),
                make(
                    "vadd",
                    a=0,
                    b=256,
                    dst=0,
                    len=77,
                    mult_a=2**31 - 1,
                    mult_b=-(2**31),
                    shift=31,
                    zp_a=-128,
                    zp_b=127,
                    zp_out=1,
                ),
                make("vadd", a=1, b=300, dst=300, len=0),
                make("vadd", a=2, b=303, dst=600, len=101, mult_a=3, mult_b=5, shift=3, lo=-20, hi=20),
                store_all(0, 800),
            ],
        )
    )
    jobs.append(
        _built(
            cfg,
            "pool_max_avg",
            [
                make(
                    "load", spad=0, dram=DATA, rows=1, cols=7 * 9 * 5, spad_stride=7 * 9 * 5, dram_stride=315
                ),
                make(
                    "pool",
                    src=0,
                    dst=1024,
                    channels=5,
                    in_w=9,
                    out_h=3,
                    out_w=4,
                    kh=3,
                    kw=3,
                    sh=2,
                    sw=2,
                    mode=0,
                    lo=-50,
                ),
                make(
                    "pool",
                    src=0,
                    dst=1200,
                    channels=5,
                    in_w=9,
                    out_h=2,
                    out_w=3,
                    kh=3,
                    kw=2,
                    sh=3,
                    sw=3,
                    mode=1,
                    mult=1 << 14,
                    shift=17,
                    zp_in=-3,
                    zp_out=4,
                ),
                # rows and pixels a different stride apart (the unit's row and pixel steps)
                make("pool", src=0, dst=1300, channels=5, in_w=9, out_h=2, out_w=3, kh=2, kw=3, sh=3, sw=2,
                     mode=1, mult=3 << 13, shift=16, zp_in=5, zp_out=-2),
                store_all(1024, 400),
            ],
        )
    )
    jobs += _int16_jobs(cfg)
    # FENCEs in a program from PROGRAM_BASE: the run goes on after each (its interrupt is cleared)
    fb = ProgramBuilder(cfg)
    for i in range(3):
        fb.add(make("load", spad=64 * i, dram=DATA + 64 * i, rows=1, cols=64, spad_stride=64, dram_stride=64))
        fb.add(make("store", spad=64 * i, dram=OUT + 64 * i, rows=1, cols=64, spad_stride=64, dram_stride=64))
        fb.fence()
    jobs.append(RtlJob("fences", encode_program(fb.build().instrs), PROG, _data(3), window=WINDOW))
    # SYNC, BARRIER and a cancellation point in a row
    jobs.append(
        _raw(
            "control_mix",
            [
                make(
                    "load",
                    spad=0,
                    dram=DATA,
                    rows=1,
                    cols=64,
                    spad_stride=64,
                    dram_stride=64,
                    signal=[Unit.STORE],
                ),
                make("barrier"),
                make("sync", unit=2, wait=[]),
                make("cancel_point", id=9),
                make(
                    "store",
                    spad=0,
                    dram=OUT,
                    rows=1,
                    cols=64,
                    spad_stride=64,
                    dram_stride=64,
                    wait=[Unit.LOAD],
                ),
                make("end"),
            ],
        )
    )
    # a token crosses the point: the pause keeps it (RESUME_TOKENS) and the resume gives it back
    jobs.append(
        _raw(
            "token_crosses_point",
            [
                make("load", rows=1, cols=4, signal=[Unit.MATRIX]),
                make("cancel_point", id=1),
                make("matmul", m=1, n=1, k=4, c=ACC_BASE, wait=[Unit.LOAD]),
                make("end"),
            ],
            pause="every",
        )
    )
    return jobs


def _int16_jobs(cfg: NpuConfig) -> list[RtlJob]:
    """int16 operands (docs/isa.md, "int16 activations"): padding, an int16 A, every vector
    instruction's int16 operands and destinations (mixed with int8, in place, unaligned, ragged)."""
    L, R, A = cfg.lanes, cfg.acc_row_bytes, ACC_BASE
    jobs = []

    # LOAD: int16 padding around rows of an odd number of bytes (the right padding starts at an odd
    # column), pad rows wider than a bus word
    jobs.append(
        _built(
            cfg,
            "load_pad_i16",
            [
                make("load", spad=3, dram=DATA + 1, rows=4, cols=19, spad_stride=61, dram_stride=23,
                     pad_top=2, pad_bottom=1, pad_left=6, pad_right=2 * cfg.bus_bytes + 4, pad_value=-128,
                     pad_i16=1),
                make("load", spad=500, dram=DATA + 7, rows=2, cols=10, spad_stride=14, dram_stride=10,
                     pad_top=1, pad_left=2, pad_right=2, pad_value=37, pad_i16=1),
                store_all(0, 560),
            ],
        )  # fmt: skip
    )
    # MATMUL with an int16 A: ragged m, n and k (k not a multiple of lanes / 2), accumulate, k = 0,
    # and the extreme products (-32768 * -128)
    for name, (m, n, k, acc) in {
        "mm_i16_ragged": (2 * cfg.clusters + 1, cfg.pes_per_cluster + 3, 3 * L // 2 + 3, 1),
        "mm_i16_init": (cfg.clusters + 1, 2 * cfg.pes_per_cluster, 2 * L + 1, 0),
        "mm_i16_k0": (3, 5, 0, 1),
        "mm_i16_extreme": (cfg.clusters, cfg.pes_per_cluster, 4 * L, 1),
    }.items():
        aks, bks = round_up(max(2 * k, 1), L) + L, round_up(max(k, 1), L)
        cs = round_up(4 * n, R)
        instrs = [
            make("load", spad=0, dram=DATA, rows=m, cols=2 * k, spad_stride=aks, dram_stride=2 * k),
            make("load", spad=4096, dram=DATA + 1536, rows=n, cols=k, spad_stride=bks, dram_stride=k),
            make("load", spad=A, dram=DATA + 3072, rows=m, cols=4 * n, spad_stride=cs, dram_stride=4 * n),
            make("matmul", a=0, b=4096, c=A, m=m, n=n, k=k, a_stride=aks, b_stride=bks, c_stride=cs,
                 accumulate=acc, a_i16=1),
            make("store", spad=A, dram=OUT, rows=m, cols=4 * n, spad_stride=cs, dram_stride=4 * n),
        ]  # fmt: skip
        job = _built(cfg, name, [i for i in instrs if i is not None], seed=len(name) + 50)
        if name == "mm_i16_extreme":  # A all -32768, B^T all -128: the largest products
            job.dram[DATA] = bytes([0x00, 0x80]) * 768 + bytes([0x80]) * 1536 + job.dram[DATA][3072:]
        jobs.append(job)
    # VMAP: int16 in place, int8 -> int16, int16 -> int8, int32 -> int16 (saturating), ReLU bounds
    jobs.append(
        _built(
            cfg,
            "vmap_i16",
            [
                load_all(0, 1024),
                load_all(A, 512, DATA + 1024),
                make("vmap", src=1, dst=1, rows=3, cols=13, src_stride=30, dst_stride=30, mult=-3, shift=1,
                     zp_in=5, zp_out=-7, src_i16=1, dst_i16=1),
                make("vmap", src=101, dst=203, rows=3, cols=11, src_stride=12, dst_stride=25,
                     mult=(1 << 30) + 5, shift=20, zp_in=-128, zp_out=3, lo=-3, hi=4, dst_i16=1),
                make("vmap", src=301, dst=403, rows=2, cols=15, src_stride=33, dst_stride=16,
                     mult=7, shift=9, zp_in=127, lo=-100, hi=90, src_i16=1),
                make("vmap", src=A + 4, dst=501, rows=3, cols=9, src_stride=40, dst_stride=19, src_type=1,
                     mult=2**31 - 1, shift=17, zp_out=-1, lo=0, dst_i16=1),
                make("vmap", src=0, dst=600, rows=0, cols=9, src_i16=1, dst_i16=1),
                store_all(0, 1024),
            ],
        )  # fmt: skip
    )
    # per-column VMAP into int16: a half step's columns start at either half of a parameter entry
    pc = ProgramBuilder(cfg)
    pc.add(make("load", spad=A, dram=DATA, rows=1, cols=1024, spad_stride=1024, dram_stride=1024))
    pc.add(make("load", spad=1001, dram=DATA + 0x1000, rows=1, cols=200, spad_stride=200, dram_stride=200))
    pc.add(load_all(0, 512))
    pc.add(make("vmap", src=A + 8, dst=600, rows=3, cols=37, src_stride=160, dst_stride=80, src_type=1,
                per_col=1, mults=1001, shifts=1001 + 160, zp_out=-3, dst_i16=1))  # fmt: skip
    pc.add(make("vmap", src=3, dst=3, rows=2, cols=23, src_stride=50, dst_stride=50, zp_in=11,
                per_col=1, mults=1005, shifts=1160, lo=-90, hi=100, src_i16=1, dst_i16=1))  # fmt: skip
    pc.add(store_all(0, 1024))
    mults = np.random.default_rng(15).integers(-(2**20), 2**20, 40).astype("<i4")
    shifts = np.random.default_rng(16).integers(6, 30, 40).astype(np.uint8)
    mults[:3] = (-(2**31), 2**31 - 1, 0)
    shifts[:4] = (63, 62, 0, 40)
    jobs.append(
        RtlJob(
            "vmap_per_column_i16",
            encode_program(pc.build().instrs),
            PROG,
            {DATA: np.random.default_rng(17).integers(0, 256, 0x1000, dtype=np.uint8).tobytes(),
             DATA + 0x1000: mults.tobytes() + shifts.tobytes()},
            window=WINDOW,
        )  # fmt: skip
    )
    # VMUL: int16 x broadcast int8 row into int16 (A16W8 gating), int16 in place, int8 x int16 into
    # int8, the extreme product (-32768 - 127)^2
    jobs.append(
        _built(
            cfg,
            "vmul_i16",
            [
                load_all(0, 1024),
                make("vmul", a=1, b=900, dst=1101, rows=4, cols=19, a_stride=40, b_stride=0, dst_stride=38,
                     mult=1 << 20, shift=27, zp_a=-5, zp_b=100, zp_out=3, a_i16=1, dst_i16=1),
                make("vmul", a=300, b=503, dst=300, rows=3, cols=21, a_stride=50, b_stride=44, dst_stride=50,
                     mult=-(1 << 30) - 7, shift=40, zp_a=127, zp_b=-128, zp_out=-2, lo=-100, hi=90,
                     a_i16=1, b_i16=1, dst_i16=1),
                make("vmul", a=601, b=702, dst=1300, rows=2, cols=17, a_stride=20, b_stride=40, dst_stride=17,
                     mult=(1 << 31) - 1, shift=45, zp_a=-128, zp_b=127, b_i16=1),
                make("vmul", a=0, b=0, dst=0, rows=3, cols=0, a_stride=9, b_stride=9, dst_stride=9, a_i16=1),
                store_all(0, 1024),
                store_all(1024, 512, OUT + 1024),
            ],
        )  # fmt: skip
    )
    # VADD: int16 + int8 into int16 (the residual of an A16W8 block), int16 in place, int8 + int16
    # into int8, extreme multipliers
    jobs.append(
        _built(
            cfg,
            "vadd_i16",
            [
                load_all(0, 1024),
                make("vadd", a=1, b=400, dst=601, len=45, mult_a=2**31 - 1, mult_b=-(2**31), shift=38,
                     zp_a=-128, zp_b=127, zp_out=1, a_i16=1, dst_i16=1),
                make("vadd", a=100, b=300, dst=100, len=37, mult_a=3, mult_b=5, shift=3, lo=-20, hi=20,
                     a_i16=1, b_i16=1, dst_i16=1),
                make("vadd", a=203, b=701, dst=800, len=29, mult_a=-7, mult_b=1 << 12, shift=12, b_i16=1),
                make("vadd", a=1, b=300, dst=300, len=0, b_i16=1, dst_i16=1),
                store_all(0, 1024),
            ],
        )  # fmt: skip
    )
    # POOL: int16 max into int16 (bounded), int16 average into int8, int8 max into int16
    jobs.append(
        _built(
            cfg,
            "pool_i16",
            [
                load_all(0, 1024),
                make("pool", src=0, dst=1024, channels=5, in_w=9, out_h=3, out_w=4, kh=3, kw=3, sh=2, sw=2,
                     mode=0, lo=-50, hi=60, src_i16=1, dst_i16=1),
                make("pool", src=1, dst=1200, channels=3, in_w=9, out_h=2, out_w=3, kh=3, kw=2, sh=3, sw=3,
                     mode=1, mult=1 << 14, shift=20, zp_in=-3, zp_out=4, src_i16=1),
                make("pool", src=3, dst=1300, channels=7, in_w=5, out_h=2, out_w=2, kh=2, kw=2, sh=2, sw=2,
                     mode=0, dst_i16=1),
                make("pool", src=2, dst=1400, channels=6, in_w=4, out_h=2, out_w=2, kh=2, kw=3, sh=1, sw=1,
                     mode=1, mult=3 << 20, shift=24, zp_out=-4, src_i16=1, dst_i16=1),
                store_all(1024, 512),
            ],
        )  # fmt: skip
    )
    return jobs


def _per_col_program(cfg: NpuConfig, acc: int) -> list[Instr]:
    b = ProgramBuilder(cfg)
    b.add(make("load", spad=acc, dram=DATA, rows=1, cols=1024, spad_stride=1024, dram_stride=1024))
    b.add(make("load", spad=1001, dram=DATA + 0x1000, rows=1, cols=200, spad_stride=200, dram_stride=200))
    b.add(make("load", spad=0, dram=DATA, rows=1, cols=512, spad_stride=512, dram_stride=512))
    b.add(make("vmap", src=acc + 8, dst=600, rows=5, cols=37, src_stride=160, dst_stride=37, src_type=1,
               per_col=1, mults=1001, shifts=1001 + 160, zp_out=-3))  # fmt: skip
    b.add(make("vmap", src=3, dst=3, rows=4, cols=40, src_stride=50, dst_stride=50, zp_in=11,
               per_col=1, mults=1005, shifts=1160, lo=-90, hi=100))  # fmt: skip
    b.add(make("vmap", src=0, dst=0, rows=0, cols=9, per_col=1, mults=0, shifts=0))
    b.add(make("store", spad=0, dram=OUT, rows=1, cols=1024, spad_stride=1024, dram_stride=1024))
    return b.build().instrs


def error_jobs(cfg: NpuConfig) -> list[RtlJob]:
    """One program per error code (and per place an error can come from)."""
    L = cfg.lanes
    ok = make("load", spad=0, dram=DATA, rows=1, cols=32, spad_stride=32, dram_stride=32)
    end = make("end")
    jobs = [
        _raw("err_opcode", [ok, bytes([0xE] + [0] * 31), end]),
        _raw(
            "err_reserved",
            [ok, (int.from_bytes(encode(make("barrier")), "little") | 1 << 200).to_bytes(32, "little")],
        ),
        _raw("err_self_token", [ok, make("load", rows=1, cols=4, wait=[Unit.LOAD]), end]),
        _raw("err_lo_hi", [make("vmap", rows=1, cols=1, lo=3, hi=2), end]),
        _raw("err_vmul_overlap", [make("vmul", b=64, dst=66, rows=2, cols=8, a_stride=8, dst_stride=8), end]),
        _raw("err_vmap_per_col_wide", [make("vmap", rows=1, cols=257, dst=512, per_col=1), end]),
        _raw("err_vlut_overlap", [make("vlut", src=0, dst=4, rows=1, cols=8, table=64), end]),
        _raw("err_vmap_i32_src_i16",
             [make("vmap", src=ACC_BASE, dst=0, rows=1, cols=4, src_type=1, src_i16=1), end]),  # fmt: skip
        _raw("err_pad_i16_odd",
             [ok, make("load", rows=1, cols=4, spad_stride=8, pad_left=3, pad_i16=1), end]),  # fmt: skip
        _raw("err_vadd_i16_inplace", [make("vadd", a=64, b=0, dst=64, len=8, dst_i16=1), end]),
        _raw("err_vmul_i16_overlap",
             [make("vmul", a=0, b=64, dst=64, rows=2, cols=8, a_stride=16, b_stride=16, dst_stride=16,
                   b_i16=1), end]),  # fmt: skip
        _raw("err_matmul_i16_range",
             [make("matmul", a=cfg.spad_bytes - 2 * L, m=1, n=1, k=2 * L, c=ACC_BASE, a_i16=1), end]),
        _raw("err_pool_i16_range",
             [make("pool", src=cfg.spad_bytes - 16, dst=0, channels=4, in_w=2, out_h=1, out_w=1, kh=2, kw=2,
                   sh=1, sw=1, src_i16=1), end]),  # fmt: skip
        _raw("err_vlut_table_range", [make("vlut", rows=1, cols=8, dst=8, table=cfg.spad_bytes - 255), end]),
        _raw("err_misaligned", [ok, make("matmul", a=2, m=1, n=1, k=1, c=ACC_BASE), end]),
        _raw("err_spad_range", [ok, make("load", spad=cfg.spad_bytes - 2, rows=1, cols=4), end]),
        _raw("err_acc_wrong_mem", [make("matmul", m=1, n=1, k=8, c=0), end]),
        _raw("err_dram_range", [make("store", dram=cfg.dram_bytes - 4, rows=1, cols=8), end]),
        _raw("err_deadlock", [make("matmul", m=1, n=1, k=8, c=ACC_BASE, wait=[Unit.VECTOR]), end]),
        _raw("err_token_end", [make("load", rows=1, cols=4, signal=[Unit.MATRIX]), end]),
        _raw(
            "err_token_overflow", [make("sync", unit=0, signal=[Unit.MATRIX])] * (cfg.token_depth + 1) + [end]
        ),
        _raw(
            "err_timeout",
            [make("load", spad=0, dram=DATA, rows=64, cols=64, spad_stride=64, dram_stride=0)] * 6 + [end],
            timeout=150,
        ),
    ]
    if 2 * cfg.vector_lanes > cfg.lanes:  # int16 steps take two lane words: word-aligned operands
        i16 = {"src_i16": 1, "dst_i16": 1}
        jobs += [
            _raw("err_wide_i16_src", [make("vmap", src=2 * L + 2, dst=8 * L, rows=1, cols=L, **i16), end]),
            _raw("err_wide_i32_src",
                 [make("vmap", src=ACC_BASE + 4, dst=0, rows=1, cols=L, src_type=1), end]),  # fmt: skip
            _raw("err_wide_row_pitch",
                 [make("vmul", a=0, b=16 * L, dst=32 * L, rows=2, cols=L, a_stride=2 * L + 2,
                       b_stride=2 * L, dst_stride=2 * L, a_i16=1, b_i16=1, dst_i16=1), end]),  # fmt: skip
            _raw("err_wide_pixel_pitch",
                 [make("pool", src=0, dst=16 * L, channels=L // 2 + 2, in_w=2, out_h=1, out_w=1, kh=1,
                       kw=1, sh=1, sw=1, **i16), end]),  # fmt: skip
        ]
    # running off the end of DRAM: a program in the last bytes with no END
    jobs.append(RtlJob("err_fetch_range", encode(ok), cfg.dram_bytes - 32, window=WINDOW, dram={}))
    return jobs


FAULT = 0x5000  # a faulting DRAM range for the bus-error jobs (between OUT and PROG)


def bus_fault_jobs(cfg: NpuConfig) -> list[RtlJob]:
    """Memory error responses on each channel: a LOAD's read, a STORE's write, an instruction fetch;
    and a prefetch past END into a faulting range, which must not fault."""

    def rows64(op: str, spad: int, dram: int, rows: int = 1, **tokens) -> Instr:
        return make(op, spad=spad, dram=dram, rows=rows, cols=64, spad_stride=64, dram_stride=64, **tokens)

    ok = rows64("load", 0, DATA)
    end = make("end")
    fault = (FAULT, FAULT + 0x400)
    bad_load = rows64("load", 256, FAULT + 0x40, rows=2, signal=[Unit.STORE])
    then_store = rows64("store", 256, OUT, wait=[Unit.LOAD])
    load_for_store = rows64("load", 0, DATA, signal=[Unit.STORE])
    bad_store = rows64("store", 0, FAULT, wait=[Unit.LOAD])
    after_end = round_up(PROG + 3 * 32, 64)  # the first beat past a 3-instruction program
    return [
        _raw("bus_load", [ok, bad_load, then_store, end], bus_fault=fault),
        _raw("bus_store", [load_for_store, bad_store, end], bus_fault=fault),
        _raw("bus_fetch", [ok, ok, ok, ok, end], bus_fault=(PROG + 2 * 32, PROG + 3 * 32)),
        _raw("bus_prefetch", [ok, ok, end], bus_fault=(after_end, PROG + 0x400)),
    ]


#: the memory window of the protection jobs: "our" model's region; [0, OWN[0]) and [OWN[1], WINDOW)
#: hold another tenant's bytes, which no job may change
OWN = (0x1000, 0x7000)


def protection_jobs(cfg: NpuConfig) -> list[RtlJob]:
    """A program that LOADs or STOREs outside its memory window (below it, or running past its end),
    or whose fetch starts or runs outside it, stops with PROTECTION at that instruction, touching
    nothing outside; one that stays inside (its prefetch may not fault) runs to DONE. The other
    tenant's bytes around the window are random, so a stray write shows in the DRAM compare."""

    def rows64(op: str, spad: int, dram: int, rows: int = 1, **tokens) -> Instr:
        return make(op, spad=spad, dram=dram, rows=rows, cols=64, spad_stride=64, dram_stride=64, **tokens)

    rng = np.random.default_rng(41)
    other = {0: rng.integers(0, 256, OWN[0], dtype=np.uint8).tobytes(),
             OWN[1]: rng.integers(0, 256, WINDOW - OWN[1], dtype=np.uint8).tobytes()}  # fmt: skip
    ok = rows64("load", 0, DATA, signal=[Unit.STORE])
    store = rows64("store", 0, OUT, wait=[Unit.LOAD])
    end = make("end")

    def job(name: str, instrs: list[Instr], window: tuple[int, int] = OWN) -> RtlJob:
        j = _raw(name, instrs, dram_window=window)
        j.dram = {**other, **j.dram}
        return j

    return [
        job("prot_inside", [ok, store, end]),
        job("prot_load_below", [ok, store, rows64("load", 256, OWN[0] - 0x100), end]),
        job("prot_load_across_limit", [ok, store, rows64("load", 256, OWN[1] - 0x40, rows=2), end]),
        job("prot_store_below", [ok, rows64("store", 0, OWN[0] - 0x40, wait=[Unit.LOAD]), end]),
        job("prot_store_across_limit",
            [ok, rows64("store", 0, OWN[1] - 0x40, rows=2, wait=[Unit.LOAD]), end]),  # fmt: skip
        job("prot_fetch_past_limit", [ok, store, ok, store, end], (OWN[0], PROG + 3 * 32)),
        job("prot_fetch_below_base", [ok, store, end], (PROG + 32, OWN[1])),
        job("prot_prefetch_at_limit", [ok, store, end], (OWN[0], PROG + 3 * 32)),
        job("prot_no_upper_limit", [ok, store, end], (OWN[0], 0)),
    ]


def random_window_jobs(cfg: NpuConfig, seeds) -> list[RtlJob]:
    """Random programs under random memory windows (byte-granular, some without an upper limit):
    windows that cut through the data, the outputs or the program stop runs with PROTECTION at
    any instruction, fetch included; the RTL must agree with the model on where and on DRAM."""
    jobs = random_jobs(cfg, seeds)
    for s, j in zip(seeds, jobs, strict=True):
        rng = np.random.default_rng(s + 77)
        end = j.base + len(j.program)
        lo = 0 if rng.random() < 0.4 else int(rng.integers(0, j.base + 1))
        hi = 0 if rng.random() < 0.3 else int(rng.integers(max(lo, j.base - 512), end + 128))
        j.dram_window = (lo, hi)
        j.name = f"{j.name}-window"
    return jobs


def random_jobs(cfg: NpuConfig, seeds, pause: str = "none", cp_prob: float = 0.15) -> list[RtlJob]:
    jobs = []
    for s in seeds:
        rp = random_program(cfg, s, cp_prob=cp_prob)
        jobs.append(
            RtlJob(
                f"seed{s}-{pause}",
                encode_program(rp.program.instrs),
                rp.prog_base,
                {a: v.tobytes() for a, v in rp.dram.items()},
                window=rp.prog_base + 4096,
                pause=pause,
            )
        )
    return jobs

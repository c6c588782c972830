"""The differential RTL-vs-model job suite: directed edge cases, error programs, random programs and
pause scenarios. Used by tests/hdl/test_core_rtl.py and by `npu hdl replay`.
"""

from __future__ import annotations

import numpy as np

from npu.arith import round_up
from npu.config import ACC_BASE, NpuConfig
from npu.isa import Instr, Unit, encode, encode_program, make
from npu.program import ProgramBuilder

from .randprog import random_program
from .rtl import RtlJob

DATA = 0x1000
OUT = 0x3000
PROG = 0x6000
WINDOW = 0x8000


def _data(seed: int, n: int = 0x2000) -> dict[int, bytes]:
    return {DATA: np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()}


def _built(cfg: NpuConfig, name: str, instrs: list[Instr], seed: int = 0, **kw) -> RtlJob:
    b = ProgramBuilder(cfg)
    for i in instrs:
        b.add(i)
    return RtlJob(name, encode_program(b.build().instrs), PROG, _data(seed), window=WINDOW, **kw)


def _raw(name: str, instrs: list[Instr | bytes], **kw) -> RtlJob:
    blob = b"".join(i if isinstance(i, bytes) else encode(i) for i in instrs)
    return RtlJob(name, blob, PROG, _data(1), window=WINDOW, **kw)


def directed_jobs(cfg: NpuConfig) -> list[RtlJob]:
    """Every instruction type with its edge cases."""
    W, L, R = cfg.bus_bytes, cfg.lanes, cfg.acc_row_bytes
    A = ACC_BASE
    jobs = []

    def store_all(spad: int, n: int, dram: int = OUT) -> Instr:
        return make("store", spad=spad, dram=dram, rows=1, cols=n, spad_stride=n, dram_stride=n)

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
                store_all(1024, 400),
            ],
        )
    )
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
        _raw("err_vlut_table_range", [make("vlut", rows=1, cols=8, dst=8, table=cfg.spad_bytes - 255), end]),
        _raw("err_misaligned", [ok, make("matmul", a=2, m=1, n=1, k=1, c=ACC_BASE), end]),
        _raw("err_spad_range", [ok, make("load", spad=cfg.spad_bytes - 2, rows=1, cols=4), end]),
        _raw("err_acc_wrong_mem", [make("matmul", m=1, n=1, k=8, c=0), end]),
        _raw("err_dram_range", [make("store", dram=cfg.dram_bytes - 4, rows=1, cols=8), end]),
        _raw("err_deadlock", [make("matmul", m=1, n=1, k=8, c=ACC_BASE, wait=[Unit.VECTOR]), end]),
        _raw("err_token_end", [make("load", rows=1, cols=4, signal=[Unit.MATRIX]), end]),
        _raw(
            "err_token_cp",
            [
                make("load", rows=1, cols=4, signal=[Unit.MATRIX]),
                make("cancel_point", id=1),
                make("matmul", m=1, n=1, k=4, c=ACC_BASE, wait=[Unit.LOAD]),
                end,
            ],
            pause="every",
        ),
        _raw(
            "err_token_overflow", [make("sync", unit=0, signal=[Unit.MATRIX])] * (cfg.token_depth + 1) + [end]
        ),
        _raw(
            "err_timeout",
            [make("load", spad=0, dram=DATA, rows=64, cols=64, spad_stride=64, dram_stride=0)] * 6 + [end],
            timeout=150,
        ),
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

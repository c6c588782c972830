"""Constrained-random NPU programs from a seed: every instruction type, conflicts on shared buffers,
DRAM round trips and cancellation points. Valid by construction (tokens from the program builder),
so the model and the RTL must agree on them bit for bit; a failing seed replays with one command.

int16 operands (`*_i16`, docs/isa.md "int16 activations") are drawn from a generator of their own,
so a seed's other draws mostly stay what they were before int16 existed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from npu.arith import round_up
from npu.config import ACC_BASE, NpuConfig
from npu.isa import IsaError, make, misaligned_operands, validate
from npu.program import BuiltProgram, ProgramBuilder
from npu.sim.golden.kernels import OnChip, execute


@dataclass
class RandomProgram:
    seed: int
    program: BuiltProgram
    dram: dict[int, np.ndarray]  # initial DRAM contents
    prog_base: int
    out_base: int
    out_bytes: int


def random_program(cfg: NpuConfig, seed: int, n_instrs: int = 24, cp_prob: float = 0.15) -> RandomProgram:
    rng = random.Random(seed)
    r16 = random.Random(seed + 0x16160000)  # int16 flags

    def i16(*operands: str, p: float = 0.3) -> dict:
        return {f"{o}_i16": int(r16.random() < p) for o in operands}
    L = cfg.lanes
    R = cfg.acc_row_bytes
    nbuf = 4
    buf = max(64, min(1024, cfg.spad_bytes // (2 * nbuf)))  # bytes per scratchpad buffer
    buf -= buf % 64
    sp = [i * buf for i in range(nbuf)]
    abuf = max(R * 4, min(2048, cfg.acc_bytes // 4))
    abuf -= abuf % R
    ac = [ACC_BASE + i * abuf for i in range(2)]
    in_base, in_bytes = 0x1000, 4096
    out_base, out_bytes = in_base + in_bytes, 4096
    dram = {in_base: np.random.default_rng(seed).integers(0, 256, in_bytes, dtype=np.uint8)}
    b = ProgramBuilder(cfg)
    cp = 0

    def dram_src(n: int) -> int:
        region = rng.choice([(in_base, in_bytes), (out_base, out_bytes)])
        return region[0] + rng.randrange(0, region[1] - n + 1)

    for _ in range(n_instrs):
        kind = rng.choice(
            [
                "load",
                "load",
                "load_acc",
                "matmul",
                "matmul",
                "vmap",
                "vmap8",
                "vadd",
                "vlut",
                "vmul",
                "pool",
                "store",
                "store_acc",
            ]
        )
        if kind == "load":
            rows, cols = rng.randint(0, 6), rng.randint(0, 40)
            pt, pb, pl, pr = rng.randint(0, 2), rng.randint(0, 2), rng.randint(0, 4), rng.randint(0, 4)
            flags = i16("pad")
            if flags["pad_i16"]:  # int16 padding: pad_left and pad_right even
                pl, pr = pl & ~1, pr & ~1
            stride = pl + cols + pr + rng.randint(0, 8)
            while (pt + rows + pb) * stride > buf:
                stride = max(pl + cols + pr, stride - 1)
                rows = max(0, rows - 1)
            dstride = cols + rng.randint(0, 16)
            b.add(
                make(
                    "load",
                    spad=rng.choice(sp),
                    dram=dram_src(max(1, rows * max(dstride, 1))),
                    rows=rows,
                    cols=cols,
                    spad_stride=stride,
                    dram_stride=dstride,
                    pad_top=pt,
                    pad_bottom=pb,
                    pad_left=pl,
                    pad_right=pr,
                    pad_value=rng.randint(-128, 127),
                    **flags,
                )
            )
        elif kind == "load_acc":
            n = rng.randrange(4, abuf + 1, 4)
            b.add(
                make(
                    "load",
                    spad=rng.choice(ac),
                    dram=dram_src(n),
                    rows=1,
                    cols=n,
                    spad_stride=n,
                    dram_stride=n,
                )
            )
        elif kind == "matmul":
            k = rng.randint(0, 40)
            ks = round_up(max(k, 1), L)
            m = rng.randint(0, min(12, buf // ks))
            n = rng.randint(0, min(12, buf // ks))
            flags = i16("a")
            aks = round_up(max(2 * k, 1), L) if flags["a_i16"] else ks  # int16 A: rows of 2k bytes
            m = min(m, buf // aks)
            cs = round_up(max(4 * n, 1), R)
            m = min(m, abuf // cs)
            b.add(
                make(
                    "matmul",
                    a=rng.choice(sp),
                    b=rng.choice(sp),
                    c=rng.choice(ac),
                    m=m,
                    n=n,
                    k=k,
                    a_stride=aks,
                    b_stride=ks,
                    c_stride=cs,
                    accumulate=rng.randint(0, 1),
                    **flags,
                )
            )
        elif kind in ("vmap", "vmap8"):
            cols = rng.randint(1, 24)
            i32 = kind == "vmap"
            flags = i16("dst") if i32 else i16("src", "dst")
            es, ed = 1 + flags.get("src_i16", 0), 1 + flags["dst_i16"]
            ss = 4 * cols + 4 * rng.randint(0, 2) if i32 else es * cols + rng.randint(0, 4)
            rows = rng.randint(1, 6)
            rows = min(rows, (abuf if i32 else buf) // ss, buf // (ed * cols))
            src, dst = (rng.choice(ac), rng.choice(sp)) if i32 else rng.sample(sp, 2)
            # per-column multipliers and shifts: any bytes of any buffer (read before the writes)
            per_col = {}
            if rng.random() < 0.4:
                per_col = dict(per_col=1, mults=rng.choice(sp) + rng.randrange(0, buf - 4 * cols),
                               shifts=rng.choice(sp) + rng.randrange(0, buf - cols))  # fmt: skip
            b.add(
                make(
                    "vmap",
                    **per_col,
                    src=src,
                    dst=dst,
                    rows=rows,
                    cols=cols,
                    src_stride=ss,
                    dst_stride=ed * cols,
                    src_type=int(i32),
                    **flags,
                    mult=rng.randint(-(2**31), 2**31 - 1),
                    shift=rng.randint(0, 40),
                    zp_in=0 if i32 else rng.randint(-128, 127),
                    zp_out=rng.randint(-128, 127),
                    lo=rng.randint(-128, 0),
                    hi=rng.randint(0, 127),
                )
            )
        elif kind == "vadd":
            # buffers are disjoint and len <= buf: dst is either an operand or apart from both
            a, bb, dst = rng.choice(sp), rng.choice(sp), rng.choice(sp)
            n = rng.randint(0, buf)
            flags = i16("a", "b", "dst")
            if any(flags.values()):  # int16 operands: 2 bytes an element, in place only alike
                n //= 2
                if any(x == dst and flags[f"{o}_i16"] != flags["dst_i16"] for o, x in (("a", a), ("b", bb))):
                    flags = dict.fromkeys(flags, 1)
            b.add(
                make(
                    "vadd",
                    **flags,
                    a=a,
                    b=bb,
                    dst=dst,
                    len=n,
                    mult_a=rng.randint(-(2**20), 2**20),
                    mult_b=rng.randint(-(2**20), 2**20),
                    shift=rng.randint(0, 24),
                    zp_a=rng.randint(-128, 127),
                    zp_b=rng.randint(-128, 127),
                    zp_out=rng.randint(-128, 127),
                )
            )
        elif kind == "vlut":
            # any int8 source (unwritten bytes are zeros) and table; in place or into another buffer
            # (which may hold the table: the table is read whole before the first write)
            if buf < 256 + 8:
                continue
            cols, rows = rng.randint(0, 40), rng.randint(0, 6)
            ss = cols + rng.randint(0, 4)
            rows = min(rows, (buf - 3) // max(ss, 1))
            src = rng.choice(sp)
            table = rng.choice(sp) + rng.randrange(0, buf - 255)
            if rng.random() < 0.3:
                src += rng.randint(0, 3)
                dst, ds = src, ss
            else:
                dst, ds = rng.choice([x for x in sp if x != src]), cols
            b.add(make("vlut", src=src, dst=dst, rows=rows, cols=cols, src_stride=ss, dst_stride=ds,
                       table=table))  # fmt: skip
        elif kind == "vmul":
            # b a full tensor or one broadcast row; the result in place of a or of b, or apart
            cols, rows = rng.randint(0, 40), rng.randint(0, 6)
            sa, sb = cols + rng.randint(0, 4), rng.choice([0, cols + rng.randint(0, 4)])
            flags = i16("a", "b", "dst")
            if any(flags.values()):  # int16 operands: strides of twice the row
                sa, sb = 2 * sa, 2 * sb
            ed = 1 + flags["dst_i16"]
            rows = min(rows, (buf - 3) // max(sa, sb, 1))
            a, bb = rng.choice(sp) + rng.randint(0, 3), rng.choice(sp) + rng.randint(0, 3)
            mode = rng.random()
            if mode < 0.25:
                dst, ds = a, sa
            elif mode < 0.4 and sb:
                dst, ds = bb, sb
            else:
                free = [x for x in sp if x // buf not in (a // buf, bb // buf)]
                if not free:
                    continue
                dst, ds = rng.choice(free), ed * cols
            for o, x in (("a", a), ("b", bb)):  # in place only over an operand of dst's type
                if x == dst:
                    flags[f"{o}_i16"] = flags["dst_i16"]
            zps = {k: rng.randint(-128, 127) for k in ("zp_a", "zp_b", "zp_out")}
            ins = make("vmul", a=a, b=bb, dst=dst, rows=rows, cols=cols, a_stride=sa, b_stride=sb,
                       dst_stride=ds, mult=rng.randint(-(2**31), 2**31 - 1), shift=rng.randint(0, 40),
                       lo=rng.randint(-128, 0), hi=rng.randint(0, 127), **zps, **flags)  # fmt: skip
            try:
                validate(ins, cfg)
            except IsaError:  # in place over one operand while the other shares its buffer
                continue
            b.add(ins)
        elif kind == "pool":
            c = rng.randint(1, 8)
            kh, kw, sh, sw = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 2), rng.randint(1, 2)
            oh, ow = rng.randint(1, 3), rng.randint(1, 3)
            in_w = (ow - 1) * sw + kw + rng.randint(0, 1)
            src, dst = rng.sample(sp, 2)
            flags = i16("src", "dst")
            es, ed = 1 + flags["src_i16"], 1 + flags["dst_i16"]
            if ((oh - 1) * sh + kh) * in_w * c * es > buf or oh * ow * c * ed > buf:
                continue
            ins = make(
                "pool", src=src, dst=dst, channels=c, in_w=in_w, out_h=oh, out_w=ow, kh=kh, kw=kw,
                **flags,
            )  # fmt: skip
            if misaligned_operands(ins, cfg):
                continue  # a pool the builder cannot split: its steps would take unaligned words
            b.add(
                make(
                    "pool",
                    src=src,
                    dst=dst,
                    channels=c,
                    in_w=in_w,
                    out_h=oh,
                    out_w=ow,
                    kh=kh,
                    kw=kw,
                    sh=sh,
                    sw=sw,
                    mode=rng.randint(0, 1),
                    mult=rng.randint(1, 1 << 16),
                    shift=rng.randint(0, 20),
                    zp_in=rng.randint(-128, 127),
                    **flags,
                )
            )
        elif kind in ("store", "store_acc"):
            src = rng.choice(ac if kind == "store_acc" else sp)
            size = abuf if kind == "store_acc" else buf
            rows, cols = rng.randint(1, 4), rng.randint(1, 48)
            ss = cols + rng.randint(0, 8)
            while rows * ss > size:
                rows -= 1
            ds = cols + rng.randint(0, 8)
            if rows == 0:
                continue
            dst = out_base + rng.randrange(0, out_bytes - rows * ds + 1)
            b.add(make("store", spad=src, dram=dst, rows=rows, cols=cols, spad_stride=ss, dram_stride=ds))
        if rng.random() < cp_prob:
            b.cancel_point(cp)
            cp += 1
    prog = b.build()
    prog_base = out_base + out_bytes
    return RandomProgram(seed, prog, dram, prog_base, out_base, out_bytes)


def sequential_reference(cfg: NpuConfig, rp: RandomProgram) -> tuple[np.ndarray, OnChip]:
    """DRAM and on-chip state after executing the program one instruction at a time, in order."""
    dram = np.zeros(cfg.dram_bytes, np.uint8)
    for addr, arr in rp.dram.items():
        dram[addr : addr + arr.nbytes] = arr.view(np.uint8).reshape(-1)
    chip = OnChip(cfg)
    for ins in rp.program.instrs:
        if ins.unit is not None:
            execute(chip, dram, ins)
    return dram, chip

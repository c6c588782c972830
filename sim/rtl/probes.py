"""Probe programs: one instruction (or a run of SYNCs) of a chosen shape each, for timing a core's
instructions on its RTL against the golden model (`npu bench board`), and for calibrating the
golden model's timing of a core whose costs are not the pipelined core's (the micro core's
firmware: `npu.timing.MICRO_COSTS`, docs/micro.md).
"""

from __future__ import annotations

from npu.arith import round_up
from npu.asm import assemble
from npu.config import ACC_BASE, NpuConfig
from npu.isa import encode_program

#: DMA shapes: (rows, cols, DRAM stride) of one LOAD or STORE
DMA_SHAPES = ((1, 8, 8), (1, 64, 64), (1, 512, 512), (1, 2048, 2048), (16, 64, 64), (16, 64, 2048),
              (64, 32, 4096), (64, 256, 256))  # fmt: skip


def dma_probes(cfg: NpuConfig) -> dict[str, str]:
    """One LOAD or one STORE per shape of DMA_SHAPES that fits the memories, by label."""
    progs = {"empty": "end"}
    dram = cfg.dram_bytes // 2  # above the driver's area, below the models the driver loads
    for rows, cols, stride in DMA_SHAPES:
        if rows * cols > cfg.spad_bytes // 2 or (rows - 1) * stride + cols > cfg.dram_bytes // 4:
            continue
        for op in ("load", "store"):
            progs[f"{op} {rows}x{cols}/{stride}"] = (
                f"{op} spad=0 dram={dram} rows={rows} cols={cols} spad_stride={cols} dram_stride={stride}"
            )
    return progs


def op_probes(cfg: NpuConfig) -> dict[str, str]:
    """Compute instructions and instruction overheads of several shapes each, by label."""
    acc, half = ACC_BASE, cfg.spad_bytes // 2
    p: dict[str, str] = {}
    for n in (1, 8):
        p[f"sync x{n}"] = "\n".join(["sync unit=load"] * n)
    # a cancellation point's and a fence's markers run in each of the four unit queues
    p["cancel_point x8"] = "\n".join(f"cancel_point id={i}" for i in range(8))
    p["fence x8"] = "\n".join(["fence"] * 8)
    # (the micro core's MAC array takes four columns and at most 1,024 k positions (512 of int16 A)
    # a block: n % 4 and k > 1,024 probe its blocks, k % 4 its last word, long rows its rate)
    shapes = ((1, 1, 8), (4, 4, 16), (8, 8, 32), (2, 8, 64), (16, 2, 8), (2, 2, 512), (16, 2, 2), (8, 2, 3),
              (4, 4, 18), (4, 8, 1), (16, 4, 64), (1, 5, 64), (2, 2, 1040), (2, 3, 520), (16, 4, 1024),
              (64, 4, 256))  # fmt: skip
    for m, n, k in shapes:
        cs = round_up(4 * n, cfg.acc_row_bytes)  # whole accumulator words
        ks = round_up(k, cfg.lanes)  # rows `lanes`-aligned, as the ISA asks
        common = f"b={half} c={acc} m={m} n={n} k={k} b_stride={ks} c_stride={cs}"
        p[f"matmul {m}x{n}x{k}"] = f"matmul a=0 a_stride={ks} {common}"
        if (m, n, k) in ((4, 4, 16), (8, 8, 32), (4, 4, 18), (8, 2, 3), (4, 8, 1), (16, 4, 64), (2, 3, 520)):
            p[f"matmul i16 {m}x{n}x{k}"] = f"matmul a=0 a_stride={2 * ks} a_i16=1 {common}"
    # B's rows apart (a convolution's taps: b_stride > k)
    cs = round_up(16, cfg.acc_row_bytes)
    p["matmul 4x4x16 b_stride 32"] = (
        f"matmul a=0 a_stride=16 b={half} c={acc} m=4 n=4 k=16 b_stride=32 c_stride={cs}"
    )
    # an accumulator's requantisation as compiled models write it (a 31-bit multiplier, a shift past
    # 32), and one with a short shift: the micro core's firmware shifts the two ranges differently
    for r, c, scale in ((1, 8, "mult=16384 shift=15"), (8, 32, "mult=1518500250 shift=38"),
                        (4, 128, "mult=1518500250 shift=38"), (8, 16, "mult=16384 shift=15")):  # fmt: skip
        shape = f"rows={r} cols={c} src_stride={4 * c} dst_stride={c}"
        p[f"vmap i32 {r}x{c}"] = f"vmap src={acc} dst={half} {shape} src_type=i32 {scale}"
    p["vmap i8 8x32"] = "vmap src=0 dst=4096 rows=8 cols=32 src_stride=32 dst_stride=32 mult=16384 shift=15"
    p["vmap per-column 8x32"] = (
        f"vmap src={acc} dst={half} rows=8 cols=32 src_stride=128 dst_stride=32 src_type=i32 per_col=1 "
        f"mults={half + 4096} shifts={half + 8192}"
    )
    for r, c in ((1, 8), (8, 64)):
        shape = f"rows={r} cols={c} src_stride={c} dst_stride={c}"
        p[f"vlut {r}x{c}"] = f"vlut src=0 dst=4096 {shape} table={half}"
        p[f"vmul {r}x{c}"] = (
            f"vmul a=0 b=2048 dst=4096 rows={r} cols={c} a_stride={c} b_stride={c} dst_stride={c} mult=16384 "
            "shift=15"
        )
    for n in (8, 512):
        p[f"vadd {n}"] = f"vadd a=0 b=2048 dst=4096 len={n} mult_a=16384 mult_b=16384 shift=15"
    for c, w, o, k in ((8, 8, 4, 2), (16, 8, 6, 3), (8, 8, 8, 1)):
        s = 2 if k == 2 else 1  # a 2x2 window strides 2; 3x3 and 1x1 stride 1
        p[f"pool {c}ch {o}x{o} k{k}"] = (
            f"pool src=0 dst=4096 channels={c} in_w={w} out_h={o} out_w={o} kh={k} kw={k} sh={s} sw={s}"
        )
    dram = cfg.dram_bytes // 2
    for r, c in ((1, 4), (8, 64), (8, 256)):
        p[f"load {r}x{c}"] = f"load spad=0 dram={dram} rows={r} cols={c} spad_stride={c} dram_stride={c}"
        p[f"store {r}x{c}"] = f"store spad=0 dram={dram} rows={r} cols={c} spad_stride={c} dram_stride={c}"
    p["load unaligned 8x64"] = f"load spad=0 dram={dram + 1} rows=8 cols=64 spad_stride=64 dram_stride=64"
    p["load padded 8x64"] = (
        f"load spad=0 dram={dram} rows=8 cols=64 spad_stride=72 dram_stride=64 pad_top=1 pad_bottom=1 "
        "pad_left=4 pad_right=4"
    )
    p["store unaligned 8x64"] = f"store spad=1 dram={dram} rows=8 cols=64 spad_stride=64 dram_stride=64"
    return p


def encode(probes: dict[str, str]) -> dict[str, bytes]:
    """Each probe's instructions and an END, as instruction words."""
    return {k: encode_program(assemble(t + "\nend" if t != "end" else t).instrs) for k, t in probes.items()}


#: probes left out of the micro core's fit: with the scratchpad's zeros as per-column shifts the
#: firmware skips the rounding shift, which no compiled model does
UNREPRESENTATIVE = ("vmap per-column 8x32",)


#: the probes of instructions without features (MICRO_OTHER, MICRO_MARKER)
MARKERS = ("sync", "cancel_point", "fence")


def fit_micro(cycles: dict[str, int], cfg: NpuConfig) -> dict:
    """MICRO_RUN, MICRO_OTHER, MICRO_MARKER and MICRO_COSTS (npu.timing) fitted to the probes' measured
    `cycles` (by label, of op_probes and dma_probes run on the micro core's RTL): per opcode, least
    squares over its probes' features (MICRO_FEATURES), each probe's cycles less the empty run's."""
    import numpy as np

    from npu.isa import decode
    from npu.timing import MICRO_FEATURES, micro_features

    run = cycles["empty"]
    other = round((cycles["sync x8"] - cycles["sync x1"]) / 7)
    # a cancellation point's or fence's markers, beyond a SYNC's dispatch (the two alike)
    marker = max(0, round(((cycles["cancel_point x8"] + cycles["fence x8"]) / 2 - cycles["sync x8"]) / 8))
    rows: dict = {}
    for label, text in {**dma_probes(cfg), **op_probes(cfg)}.items():
        if label in UNREPRESENTATIVE or label not in cycles or label.split()[0] in ("empty", *MARKERS):
            continue
        ins = decode(encode({label: text})[label][:32])
        rows.setdefault(ins.op, []).append((micro_features(ins), cycles[label] - run))
    costs = {}
    for op, samples in rows.items():
        names = MICRO_FEATURES[op]
        a = np.array([[f[n] for n in names] for f, _ in samples], float)
        b = np.array([c for _, c in samples], float)
        used = a.any(axis=0)  # a feature no probe exercises costs nothing measured
        coef = np.zeros(len(names))
        while True:  # no cost is negative: the most negative feature costs nothing, the rest refitted
            coef[:] = 0
            coef[used] = np.linalg.lstsq(a[:, used], b, rcond=None)[0]
            if (coef >= 0).all():
                break
            used[np.argmin(coef)] = False
        costs[op.name] = {n: round(float(c), 2) for n, c in zip(names, coef, strict=True)}
    return {"MICRO_RUN": run, "MICRO_OTHER": other, "MICRO_MARKER": marker, "MICRO_COSTS": costs}


def main(argv: list[str] | None = None) -> int:
    """`python -m npu.sim.rtl.probes BENCH.json`: the micro core's costs fitted to the probes of
    `npu bench board --board icebreaker --json > BENCH.json`, as npu/timing.py writes them."""
    import argparse
    import json

    from npu.config import get_config

    p = argparse.ArgumentParser(prog="python -m npu.sim.rtl.probes", description=main.__doc__)
    p.add_argument("bench", help="the JSON of `npu bench board --board icebreaker --json`")
    args = p.parse_args(argv)
    r = json.loads(open(args.bench).read())
    cycles = {row["probe"]: row["cycles"] for row in r.get("probes", [])}
    if "empty" not in cycles:
        p.error(f"{args.bench}: no probe figures (run the bench without --no-probes)")
    print(json.dumps(fit_micro(cycles, get_config(r["config"])), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

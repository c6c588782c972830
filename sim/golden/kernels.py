"""Bit-exact numpy semantics of each unit instruction (docs/isa.md gives the same rules in prose).

The on-chip state is two byte arrays, the scratchpad and the accumulators; `OnChip.view` maps an
ISA address range to the right one. Every kernel reads all its sources before it writes.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from npu.config import ACC_BASE, NpuConfig
from npu.isa import LUT_BYTES, MAX_SHIFT, Instr, Opcode, clamp_bounds, elem_bytes


class OnChip:
    def __init__(self, cfg: NpuConfig):
        self.spad = np.zeros(cfg.spad_bytes, np.uint8)
        self.acc = np.zeros(cfg.acc_bytes, np.uint8)

    def mem(self, addr: int) -> tuple[np.ndarray, int]:
        """(backing array, offset) of an on-chip address (ranges were validated at dispatch)."""
        if addr >= ACC_BASE:
            return self.acc, addr - ACC_BASE
        return self.spad, addr

    def read(self, addr: int, n: int) -> np.ndarray:
        m, o = self.mem(addr)
        return m[o : o + n].copy()

    def write(self, addr: int, data: np.ndarray) -> None:
        m, o = self.mem(addr)
        m[o : o + len(data)] = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)


def rows_view(buf: np.ndarray, off: int, rows: int, width: int, stride: int, dtype=np.uint8) -> np.ndarray:
    """A rows x width view of `buf` (bytes) at byte offset `off` with a byte row stride."""
    # the ndarray constructor (unlike as_strided, ten times slower) checks the view lies in `buf`
    es = np.dtype(dtype).itemsize
    return np.ndarray((rows, width), dtype, buffer=buf, offset=off, strides=(stride, es))


def read_elems(
    buf: np.ndarray, off: int, rows: int, cols: int, stride: int, es: int, dtype=np.int64
) -> np.ndarray:
    """rows x cols int8 (es 1) or little-endian int16 (es 2) elements as `dtype`, a copy."""
    raw = rows_view(buf, off, rows, es * cols, stride)
    return (raw.view(np.int8) if es == 1 else raw.view("<i2")).astype(dtype)  # astype copies


def to_bytes(y: np.ndarray, es: int) -> np.ndarray:
    """Elements already clamped to their type as a byte array with rows of `es * cols` bytes."""
    y = y.astype(np.int8 if es == 1 else "<i2")
    return y.view(np.uint8).reshape(*y.shape[:-1], es * y.shape[-1])


def _put_rows(buf: np.ndarray, off: int, stride: int, data: np.ndarray) -> None:
    """Write a 2-D byte array row by row in order (defined even when rows overlap)."""
    rows, width = data.shape
    if rows == 0 or width == 0:
        return
    if stride >= width:
        rows_view(buf, off, rows, width, stride)[...] = data
    else:
        for r in range(rows):
            buf[off + r * stride : off + r * stride + width] = data[r]


def rshift_round(x: np.ndarray, shift: int | np.ndarray) -> np.ndarray:
    """Rounding arithmetic right shift on int64: (x + 2**(shift-1)) >> shift; ties go up. `shift`
    may be an array (one per column)."""
    if np.ndim(shift):
        s = np.asarray(shift, np.int64)
        return (x + np.where(s > 0, np.left_shift(np.int64(1), np.maximum(s - 1, 0)), 0)) >> s
    if shift == 0:
        return x
    return (x + np.int64(1 << (shift - 1))) >> np.int64(shift)


def requant(x: np.ndarray, mult, shift, zp_out: int, lo: int, hi: int) -> np.ndarray:
    """clamp(zp_out + rsr(x * mult, shift), lo, hi) as int64; `mult` and `shift` may be per-column
    arrays (broadcast over the rows of x)."""
    y = rshift_round(x.astype(np.int64) * np.asarray(mult, np.int64), shift) + np.int64(zp_out)
    return np.clip(y, lo, hi)


def exec_load(chip: OnChip, dram: np.ndarray, f: dict) -> None:
    rows, cols = f["rows"], f["cols"]
    pt, pb, pl, pr = f["pad_top"], f["pad_bottom"], f["pad_left"], f["pad_right"]
    tr, tw = pt + rows + pb, pl + cols + pr
    if tr == 0 or tw == 0:
        return
    img = np.full((tr, tw), np.uint8(f["pad_value"] & 0xFF), np.uint8)
    if f["pad_i16"]:  # int16 elements pad_value * 256: low bytes (even columns) zero
        img[:, 0::2] = 0
    if rows and cols:
        img[pt : pt + rows, pl : pl + cols] = rows_view(dram, f["dram"], rows, cols, f["dram_stride"])
    buf, off = chip.mem(f["spad"])
    _put_rows(buf, off, f["spad_stride"], img)


def exec_store(chip: OnChip, dram: np.ndarray, f: dict) -> None:
    rows, cols = f["rows"], f["cols"]
    if rows == 0 or cols == 0:
        return
    buf, off = chip.mem(f["spad"])
    data = rows_view(buf, off, rows, cols, f["spad_stride"]).copy()
    _put_rows(dram, f["dram"], f["dram_stride"], data)


def exec_matmul(chip: OnChip, f: dict) -> None:
    m, n, k = f["m"], f["n"], f["k"]
    if m == 0 or n == 0:
        return
    acc, coff = chip.mem(f["c"])
    c = rows_view(acc, coff, m, n, f["c_stride"], np.int32)
    if k:
        # straight to float64 (copies, read before any write), no int64 intermediates: float64
        # BLAS is exact here, |sum| <= 65535 * 2**22 < 2**53, and so is adding an int32 to it
        a = read_elems(chip.spad, f["a"], m, k, f["a_stride"], elem_bytes(f, "a"), np.float64)
        b = rows_view(chip.spad, f["b"], n, k, f["b_stride"]).view(np.int8).astype(np.float64)
        p = a @ b.T
    else:
        p = np.zeros((m, n), np.float64)
    if f["accumulate"]:
        p += c
    c[...] = p.astype(np.int64).astype(np.int32)  # wraps modulo 2**32, as the int32 accumulators do


def exec_vmap(chip: OnChip, f: dict) -> None:
    rows, cols = f["rows"], f["cols"]
    if rows == 0 or cols == 0:
        return
    buf, off = chip.mem(f["src"])
    if f["src_type"]:
        x = rows_view(buf, off, rows, cols, f["src_stride"], np.int32).astype(np.int64)
    else:
        x = read_elems(buf, off, rows, cols, f["src_stride"], elem_bytes(f, "src")) - f["zp_in"]
    mult, shift = f["mult"], f["shift"]
    if f["per_col"]:  # per column, read whole before any write; shifts above 62 act as 62
        mult = chip.spad[f["mults"] : f["mults"] + 4 * cols].copy().view("<i4").astype(np.int64)
        shift = np.minimum(chip.spad[f["shifts"] : f["shifts"] + cols] & 63, MAX_SHIFT).astype(np.int64)
    y = requant(x, mult, shift, f["zp_out"], *clamp_bounds(f))
    _put_rows(chip.spad, f["dst"], f["dst_stride"], to_bytes(y, elem_bytes(f, "dst")))


def exec_vlut(chip: OnChip, f: dict) -> None:
    rows, cols = f["rows"], f["cols"]
    if rows == 0 or cols == 0:
        return
    table = chip.spad[f["table"] : f["table"] + LUT_BYTES].copy()  # read whole before any write
    x = rows_view(chip.spad, f["src"], rows, cols, f["src_stride"])
    y = table[x ^ np.uint8(0x80)]  # int8 x (its byte u) indexes entry x + 128 = u ^ 0x80
    _put_rows(chip.spad, f["dst"], f["dst_stride"], y)


def exec_vmul(chip: OnChip, f: dict) -> None:
    rows, cols = f["rows"], f["cols"]
    if rows == 0 or cols == 0:
        return
    a = read_elems(chip.spad, f["a"], rows, cols, f["a_stride"], elem_bytes(f, "a")) - f["zp_a"]
    b = read_elems(chip.spad, f["b"], rows, cols, f["b_stride"], elem_bytes(f, "b")) - f["zp_b"]
    y = requant(a * b, f["mult"], f["shift"], f["zp_out"], *clamp_bounds(f))
    _put_rows(chip.spad, f["dst"], f["dst_stride"], to_bytes(y, elem_bytes(f, "dst")))


def exec_vadd(chip: OnChip, f: dict) -> None:
    n = f["len"]
    if n == 0:
        return
    a = read_elems(chip.spad, f["a"], 1, n, 0, elem_bytes(f, "a"))[0] - f["zp_a"]
    b = read_elems(chip.spad, f["b"], 1, n, 0, elem_bytes(f, "b"))[0] - f["zp_b"]
    s = a * f["mult_a"] + b * f["mult_b"]
    y = np.clip(rshift_round(s, f["shift"]) + f["zp_out"], *clamp_bounds(f))
    es = elem_bytes(f, "dst")
    chip.spad[f["dst"] : f["dst"] + es * n] = to_bytes(y, es)


def exec_pool(chip: OnChip, f: dict) -> None:
    C, W, oh, ow = f["channels"], f["in_w"], f["out_h"], f["out_w"]
    if C == 0 or oh == 0 or ow == 0:
        return
    kh, kw, sh, sw = f["kh"], f["kw"], f["sh"], f["sw"]
    in_rows = (oh - 1) * sh + kh
    ei, eo = elem_bytes(f, "src"), elem_bytes(f, "dst")
    x = read_elems(chip.spad, f["src"], 1, in_rows * W * C, 0, ei).reshape(in_rows, W, C)
    # windows: (oh, ow, kh, kw, C) strided view, no copy
    s0, s1, s2 = x.strides
    win = as_strided(x, shape=(oh, ow, kh, kw, C), strides=(s0 * sh, s1 * sw, s0, s1, s2))
    lo, hi = clamp_bounds(f)
    if f["mode"] == 0:
        y = np.clip(win.max(axis=(2, 3)), lo, hi)
    else:
        s = win.sum(axis=(2, 3)) - kh * kw * f["zp_in"]
        y = requant(s, f["mult"], f["shift"], f["zp_out"], lo, hi)
    chip.spad[f["dst"] : f["dst"] + eo * oh * ow * C] = to_bytes(y.reshape(1, -1), eo)[0]


def execute(chip: OnChip, dram: np.ndarray, i: Instr) -> None:
    """Apply one unit instruction's effect (control instructions have none)."""
    f = i.fields
    op = i.op
    if op == Opcode.LOAD:
        exec_load(chip, dram, f)
    elif op == Opcode.STORE:
        exec_store(chip, dram, f)
    elif op == Opcode.MATMUL:
        exec_matmul(chip, f)
    elif op == Opcode.VMAP:
        exec_vmap(chip, f)
    elif op == Opcode.VADD:
        exec_vadd(chip, f)
    elif op == Opcode.VLUT:
        exec_vlut(chip, f)
    elif op == Opcode.VMUL:
        exec_vmul(chip, f)
    elif op == Opcode.POOL:
        exec_pool(chip, f)

"""int16 activations on the golden model (docs/isa.md, "int16 activations"): every instruction that
takes an `*_i16` flag against an element-by-element reference, the rules that guard them, and the
cycle costs they change."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu.arith import round_up
from npu.config import ACC_BASE, get_config
from npu.isa import ErrorCode, IsaError, make, validate
from npu.timing import duration
from tests.sim.helpers import DATA_BASE, assert_done, read, run_instrs

CFG = get_config("default")
OUT = 0x8000


def rsr(v: int, s: int) -> int:
    return (v + (1 << (s - 1))) >> s if s else v


def clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def bounds(lo: int, hi: int, wide: bool) -> tuple[int, int]:
    return (lo * 256, hi * 256 + 255) if wide else (lo, hi)


def elems(rng, n: int, wide: bool) -> np.ndarray:
    return (
        rng.integers(-32768, 32768, n).astype("<i2") if wide else rng.integers(-128, 128, n).astype(np.int8)
    )


def _requant(data) -> dict:
    lo = data.draw(st.integers(-128, 0))
    return dict(
        mult=data.draw(st.integers(-(2**31), 2**31 - 1)),
        shift=data.draw(st.integers(0, 62)),
        zp_out=data.draw(st.integers(-128, 127)),
        lo=lo,
        hi=data.draw(st.integers(lo, 127)),
    )


@settings(max_examples=30)
@given(data=st.data())
def test_load_int16_padding(data):
    rows, cols = data.draw(st.integers(1, 4)), 2 * data.draw(st.integers(1, 6))
    pl, pr = 2 * data.draw(st.integers(0, 3)), 2 * data.draw(st.integers(0, 3))
    pt, pb = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))
    pv = data.draw(st.integers(-128, 127))
    src = np.random.default_rng(data.draw(st.integers(0, 99))).integers(-128, 128, 256).astype(np.int8)
    tr, tw = pt + rows + pb, pl + cols + pr
    instrs = [
        make("load", spad=0, dram=DATA_BASE, rows=rows, cols=cols, spad_stride=tw, dram_stride=cols,
             pad_top=pt, pad_bottom=pb, pad_left=pl, pad_right=pr, pad_value=pv, pad_i16=1),
        make("store", spad=0, dram=OUT, rows=tr, cols=tw, spad_stride=tw, dram_stride=tw),
    ]  # fmt: skip
    m = run_instrs(CFG, instrs, {DATA_BASE: src})
    assert_done(m)
    got = read(m, OUT, (tr, tw // 2), "<i2")
    want = np.full((tr, tw // 2), pv * 256, np.int64)
    want[pt : pt + rows, pl // 2 : (pl + cols) // 2] = src[: rows * cols].view("<i2").reshape(rows, cols // 2)
    assert np.array_equal(got, want)


@settings(max_examples=30)
@given(data=st.data())
def test_matmul_int16_a(data):
    L = CFG.lanes
    m_, n_, k_ = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 9)), data.draw(st.integers(1, 40))
    accumulate = data.draw(st.booleans())
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    a = rng.integers(-32768, 32768, (m_, k_)).astype("<i2")
    bt = rng.integers(-128, 128, (n_, k_)).astype(np.int8)
    c0 = rng.integers(-(2**31), 2**31, (m_, n_)).astype("<i4")
    a_stride = -(-2 * k_ // L) * L + L * data.draw(st.integers(0, 1))
    b_stride = -(-k_ // L) * L
    c_stride = -(-4 * n_ // CFG.acc_row_bytes) * CFG.acc_row_bytes
    a_img = np.zeros((m_, a_stride), np.uint8)
    a_img[:, : 2 * k_] = a.view(np.uint8).reshape(m_, 2 * k_)
    b_img = np.zeros((n_, b_stride), np.int8)
    b_img[:, :k_] = bt
    c_img = np.zeros((m_, c_stride // 4), "<i4")
    c_img[:, :n_] = c0
    A, B = 0, 0x4000
    data_a, data_b, data_c = DATA_BASE, DATA_BASE + 0x2000, DATA_BASE + 0x4000
    instrs = [
        make("load", spad=A, dram=data_a, rows=1, cols=a_img.size, spad_stride=a_img.size, dram_stride=0),
        make("load", spad=B, dram=data_b, rows=1, cols=b_img.size, spad_stride=b_img.size, dram_stride=0),
        make("load", spad=ACC_BASE, dram=data_c, rows=1, cols=c_img.nbytes, spad_stride=0, dram_stride=0),
        make("matmul", a=A, b=B, c=ACC_BASE, m=m_, n=n_, k=k_, a_stride=a_stride, b_stride=b_stride,
             c_stride=c_stride, accumulate=int(accumulate), a_i16=1),
        make("store", spad=ACC_BASE, dram=OUT, rows=1, cols=c_img.nbytes, spad_stride=0, dram_stride=0),
    ]  # fmt: skip
    m = run_instrs(CFG, instrs, {data_a: a_img, data_b: b_img, data_c: c_img})
    assert_done(m)
    got = read(m, OUT, (m_, c_stride // 4), "<i4")[:, :n_]
    want = a.astype(np.int64) @ bt.astype(np.int64).T + (c0.astype(np.int64) if accumulate else 0)
    want = ((want + 2**31) % 2**32 - 2**31).astype(np.int64)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("src", ["i8", "i16", "i32"])
@pytest.mark.parametrize("dst_wide", [False, True], ids=["dst_i8", "dst_i16"])
@settings(max_examples=20)
@given(data=st.data())
def test_vmap_element_types(src, dst_wide, data):
    rows, cols = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 40))
    p = _requant(data)
    zp_in = data.draw(st.integers(-128, 127)) if src != "i32" else 0
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    es = {"i8": 1, "i16": 2, "i32": 4}[src]
    x = {"i8": lambda: elems(rng, rows * cols, False), "i16": lambda: elems(rng, rows * cols, True),
         "i32": lambda: rng.integers(-(2**31), 2**31, rows * cols).astype("<i4")}[src]()  # fmt: skip
    base = ACC_BASE if src == "i32" else 64
    de = 2 if dst_wide else 1
    instrs = [
        make("load", spad=base, dram=DATA_BASE, rows=1, cols=x.nbytes, spad_stride=x.nbytes, dram_stride=0),
        make("vmap", src=base, dst=0x2000, rows=rows, cols=cols, src_stride=es * cols, dst_stride=de * cols,
             src_type=int(src == "i32"), src_i16=int(src == "i16"), dst_i16=int(dst_wide), zp_in=zp_in, **p),
        make("store", spad=0x2000, dram=OUT, rows=1, cols=de * rows * cols, spad_stride=0, dram_stride=0),
    ]  # fmt: skip
    m = run_instrs(CFG, instrs, {DATA_BASE: x})
    assert_done(m)
    got = read(m, OUT, (rows * cols,), "<i2" if dst_wide else np.int8)
    lo, hi = bounds(p["lo"], p["hi"], dst_wide)
    want = [clamp(p["zp_out"] + rsr((int(v) - zp_in) * p["mult"], p["shift"]), lo, hi) for v in x]
    assert got.tolist() == want


@pytest.mark.parametrize("types", ["16,16,16", "16,8,16", "8,16,8", "8,8,16"])
@settings(max_examples=20)
@given(data=st.data())
def test_vmul_and_vadd_element_types(types, data):
    wa, wb, wd = (t == "16" for t in types.split(","))
    rows, cols = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 30))
    n = rows * cols
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    xa, xb = elems(rng, n, wa), elems(rng, n, wb)
    za, zb = data.draw(st.integers(-128, 127)), data.draw(st.integers(-128, 127))
    p = _requant(data)
    flags = dict(a_i16=int(wa), b_i16=int(wb), dst_i16=int(wd))
    A, B, D = 0, 0x1000, 0x2000
    de = 2 if wd else 1
    mul = make("vmul", a=A, b=B, dst=D, rows=rows, cols=cols, a_stride=xa.itemsize * cols,
               b_stride=xb.itemsize * cols, dst_stride=de * cols, zp_a=za, zp_b=zb, **p, **flags)  # fmt: skip
    mult_a, mult_b = data.draw(st.integers(-(2**31), 2**31 - 1)), data.draw(st.integers(-(2**31), 2**31 - 1))
    q = {k: v for k, v in p.items() if k != "mult"}
    add = make(
        "vadd", a=A, b=B, dst=D + 0x1000, len=n, mult_a=mult_a, mult_b=mult_b, zp_a=za, zp_b=zb, **q, **flags
    )
    instrs = [
        make("load", spad=A, dram=DATA_BASE, rows=1, cols=xa.nbytes, spad_stride=0, dram_stride=0),
        make("load", spad=B, dram=DATA_BASE + 0x1000, rows=1, cols=xb.nbytes, spad_stride=0, dram_stride=0),
        mul,
        add,
        make("store", spad=D, dram=OUT, rows=1, cols=de * n, spad_stride=0, dram_stride=0),
        make("store", spad=D + 0x1000, dram=OUT + 0x1000, rows=1, cols=de * n, spad_stride=0, dram_stride=0),
    ]
    m = run_instrs(CFG, instrs, {DATA_BASE: xa, DATA_BASE + 0x1000: xb})
    assert_done(m)
    dt = "<i2" if wd else np.int8
    lo, hi = bounds(p["lo"], p["hi"], wd)
    va, vb = [int(v) - za for v in xa], [int(v) - zb for v in xb]
    want_mul = [
        clamp(p["zp_out"] + rsr(a * b * p["mult"], p["shift"]), lo, hi) for a, b in zip(va, vb, strict=True)
    ]
    want_add = [
        clamp(p["zp_out"] + rsr(a * mult_a + b * mult_b, p["shift"]), lo, hi)
        for a, b in zip(va, vb, strict=True)
    ]
    assert read(m, OUT, (n,), dt).tolist() == want_mul
    assert read(m, OUT + 0x1000, (n,), dt).tolist() == want_add


@pytest.mark.parametrize("mode", [0, 1], ids=["max", "avg"])
@pytest.mark.parametrize("types", ["16,16", "16,8"])
@settings(max_examples=15)
@given(data=st.data())
def test_pool_element_types(mode, types, data):
    wi, wo = (t == "16" for t in types.split(","))
    C, W = data.draw(st.integers(1, 20)), data.draw(st.integers(2, 6))
    if C > CFG.lanes // 2 and 2 * CFG.vector_lanes > CFG.lanes:
        C = round_up(C, CFG.lanes // 2)  # an int16 pixel whose steps take two lane words: whole words
    kh, kw, sh, sw = 2, 2, data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    oh, ow = data.draw(st.integers(1, 3)), (W - kw) // sw + 1
    in_rows = (oh - 1) * sh + kh
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    x = elems(rng, in_rows * W * C, wi)
    p = (
        _requant(data)
        if mode
        else dict(lo=data.draw(st.integers(-128, 0)), hi=data.draw(st.integers(0, 127)))
    )
    eo = 2 if wo else 1
    instrs = [
        make("load", spad=0, dram=DATA_BASE, rows=1, cols=x.nbytes, spad_stride=0, dram_stride=0),
        make("pool", src=0, dst=0x4000, channels=C, in_w=W, out_h=oh, out_w=ow, kh=kh, kw=kw, sh=sh, sw=sw,
             mode=mode, src_i16=int(wi), dst_i16=int(wo), **p),
        make("store", spad=0x4000, dram=OUT, rows=1, cols=eo * oh * ow * C, spad_stride=0, dram_stride=0),
    ]  # fmt: skip
    m = run_instrs(CFG, instrs, {DATA_BASE: x})
    assert_done(m)
    got = read(m, OUT, (oh, ow, C), "<i2" if wo else np.int8)
    xi = x.astype(np.int64).reshape(in_rows, W, C)
    lo, hi = bounds(p["lo"], p["hi"], wo)
    for y in range(oh):
        for xx in range(ow):
            win = xi[y * sh : y * sh + kh, xx * sw : xx * sw + kw]
            for c in range(C):
                v = (
                    int(win[:, :, c].max())
                    if mode == 0
                    else rsr(int(win[:, :, c].sum()) * p["mult"], p["shift"]) + p["zp_out"]
                )
                assert got[y, xx, c] == clamp(v, lo, hi)


def test_int16_rules():
    """Flags that cannot hold are ILLEGAL_FIELD, as the hardware reports them."""
    bad = [
        make("vmap", src=ACC_BASE, dst=0, rows=1, cols=4, src_stride=16, dst_stride=4, src_type=1, src_i16=1),
        make("load", spad=0, dram=0, rows=1, cols=4, spad_stride=8, pad_left=1, pad_right=3, pad_i16=1),
        # in place with another element type: the wider writes would overtake the reads
        make("vmap", src=0, dst=0, rows=1, cols=8, src_stride=8, dst_stride=8, dst_i16=1),
        make("vadd", a=0, b=64, dst=0, len=8, a_i16=1),
        make("vmul", a=0, b=64, dst=0, rows=1, cols=8, a_stride=8, b_stride=8, dst_stride=8, dst_i16=1),
    ]
    for i in bad:
        with pytest.raises(IsaError) as e:
            validate(i, CFG)
        assert e.value.code == ErrorCode.ILLEGAL_FIELD, i
    # the same element type in place is fine, and int16 ranges are counted in bytes
    validate(
        make("vmap", src=0, dst=0, rows=1, cols=8, src_stride=16, dst_stride=16, src_i16=1, dst_i16=1), CFG
    )
    with pytest.raises(IsaError) as e:
        validate(make("vadd", a=CFG.spad_bytes - 8, b=0, dst=64, len=8, a_i16=1), CFG)
    assert e.value.code == ErrorCode.SPAD_RANGE


def test_int16_costs():
    """An int16 A takes twice the k steps, or int8's with `a16_full_rate`; a vector step takes as
    many int16 elements as int8."""
    L, VL = CFG.lanes, CFG.vector_lanes
    mm = dict(
        a=0,
        b=0x4000,
        c=ACC_BASE,
        m=CFG.clusters,
        n=CFG.pes_per_cluster,
        k=4 * L,
        a_stride=8 * L,
        b_stride=4 * L,
        c_stride=CFG.acc_row_bytes,
    )
    assert CFG.a16_full_rate  # `default`; the half-rate array beside it
    half = CFG.replace(a16_full_rate=False)
    for cfg, steps16 in ((CFG, 4), (half, 8)):
        d8 = duration(make("matmul", **mm), cfg) - cfg.matrix_latency
        d16 = duration(make("matmul", **mm, a_i16=1), cfg) - cfg.matrix_latency
        assert (d8, d16) == (4, steps16), cfg
    vm = dict(src=0, dst=0x2000, rows=1, cols=4 * VL, src_stride=0, dst_stride=0)
    assert duration(make("vmap", **vm, src_i16=1), CFG) - CFG.vector_latency == 4
    assert duration(make("vmap", **vm, src_i16=1, dst_i16=1), CFG) - CFG.vector_latency == 4
    assert duration(make("vmap", **vm), CFG) - CFG.vector_latency == 4


def test_int16_steps_of_two_words_need_word_aligned_operands():
    """`default`'s 8 vector lanes take 16 bytes of int16 a step, two lane words: such an operand
    must be word-aligned (MISALIGNED otherwise); one of at most a word a row may sit anywhere."""
    pool = dict(dst=0x4000, in_w=2, out_h=1, out_w=1, kh=1, kw=1, sh=1, sw=1, src_i16=1, dst_i16=1)
    validate(make("pool", src=0, channels=8, **pool), CFG)
    validate(make("pool", src=2, channels=4, **pool), CFG)  # 8 bytes a pixel: one word
    for bad in (dict(src=2, channels=8), dict(src=0, channels=6)):
        with pytest.raises(IsaError) as e:
            validate(make("pool", **bad, **pool), CFG)
        assert e.value.code == ErrorCode.MISALIGNED
    vmap = dict(dst=0x4000, rows=2, cols=8, src_stride=16, dst_stride=16, src_i16=1, dst_i16=1)
    validate(make("vmap", src=8, **vmap), CFG)
    with pytest.raises(IsaError) as e:
        validate(make("vmap", src=10, **vmap), CFG)
    assert e.value.code == ErrorCode.MISALIGNED

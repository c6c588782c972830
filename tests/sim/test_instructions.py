"""Each instruction on the golden model against an independent, element-by-element reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu.arith import round_up
from npu.config import ACC_BASE, get_config
from npu.isa import make
from tests.sim.helpers import DATA_BASE, assert_done, read, run_instrs

CFGS = [get_config("tiny"), get_config("default")]
OUT = 0x8000


def rsr(v: int, s: int) -> int:
    """Reference rounding shift with Python's unbounded ints."""
    return (v + (1 << (s - 1))) >> s if s else v


def clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


@pytest.mark.parametrize("cfg", CFGS, ids=lambda c: c.name)
@settings(max_examples=40)
@given(data=st.data())
def test_load_with_padding_then_store(cfg, data):
    rows = data.draw(st.integers(0, 6))
    cols = data.draw(st.integers(0, 20))
    pt, pb = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))
    pl, pr = data.draw(st.integers(0, 5)), data.draw(st.integers(0, 5))
    pad_value = data.draw(st.integers(-128, 127))
    dram_stride = cols + data.draw(st.integers(0, 9))
    spad_stride = pl + cols + pr + data.draw(st.integers(0, 3))
    spad = data.draw(st.integers(0, 64))
    src = np.random.default_rng(data.draw(st.integers(0, 99))).integers(-128, 128, 4096, dtype=np.int8)
    tr, tw = pt + rows + pb, pl + cols + pr
    instrs = [
        make(
            "load",
            spad=spad,
            dram=DATA_BASE,
            rows=rows,
            cols=cols,
            spad_stride=spad_stride,
            dram_stride=dram_stride,
            pad_top=pt,
            pad_bottom=pb,
            pad_left=pl,
            pad_right=pr,
            pad_value=pad_value,
        ),
        make("store", spad=spad, dram=OUT, rows=tr, cols=tw, spad_stride=spad_stride, dram_stride=tw),
    ]
    m = run_instrs(cfg, instrs, {DATA_BASE: src})
    assert_done(m)
    got = read(m, OUT, (tr, tw)) if tr * tw else np.zeros((tr, tw), np.int8)
    want = np.full((tr, tw), pad_value, np.int8)
    for r in range(rows):
        for c in range(cols):
            want[pt + r, pl + c] = src[r * dram_stride + c]
    assert np.array_equal(got, want)


@pytest.mark.parametrize("cfg", CFGS, ids=lambda c: c.name)
@settings(max_examples=40)
@given(data=st.data())
def test_matmul_and_accumulate(cfg, data):
    m_, n_, k_ = (data.draw(st.integers(0, 12)), data.draw(st.integers(0, 12)), data.draw(st.integers(0, 40)))
    L, R = cfg.lanes, cfg.acc_row_bytes
    a_stride = round_up(max(k_, 1), L) + L * data.draw(st.integers(0, 1))
    c_stride = round_up(max(4 * n_, 1), R)
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    extreme = data.draw(st.booleans())
    lo_hi = (-128, -127) if extreme else (-128, 128)
    a = rng.integers(*lo_hi, (m_, k_), dtype=np.int8)
    bt = rng.integers(*lo_hi, (n_, k_), dtype=np.int8)
    c0 = rng.integers(-(2**31), 2**31, (m_, n_), dtype=np.int64).astype(np.int32)
    A, B, _C = 0, 1024, 3072  # spad addresses (all multiples of lanes)
    AD, BD, CD = DATA_BASE, DATA_BASE + 2048, DATA_BASE + 4096
    acc = int(data.draw(st.booleans()))
    instrs = []
    if m_ and k_:
        instrs.append(make("load", spad=A, dram=AD, rows=m_, cols=k_, spad_stride=a_stride, dram_stride=k_))
    if n_ and k_:
        instrs.append(make("load", spad=B, dram=BD, rows=n_, cols=k_, spad_stride=a_stride, dram_stride=k_))
    if m_ and n_:
        instrs.append(
            make(
                "load", spad=ACC_BASE, dram=CD, rows=m_, cols=4 * n_, spad_stride=c_stride, dram_stride=4 * n_
            )
        )
    instrs.append(
        make(
            "matmul",
            a=A,
            b=B,
            c=ACC_BASE,
            m=m_,
            n=n_,
            k=k_,
            a_stride=a_stride,
            b_stride=a_stride,
            c_stride=c_stride,
            accumulate=acc,
        )
    )
    if m_ and n_:
        instrs.append(
            make(
                "store",
                spad=ACC_BASE,
                dram=OUT,
                rows=m_,
                cols=4 * n_,
                spad_stride=c_stride,
                dram_stride=4 * n_,
            )
        )
    m = run_instrs(cfg, instrs, {AD: a, BD: bt, CD: c0})
    assert_done(m)
    if not (m_ and n_):
        return
    want = a.astype(np.int64) @ bt.astype(np.int64).T
    if acc:
        want += c0
    want = ((want + 2**31) % 2**32 - 2**31).astype(np.int32)  # int32 wrap-around
    assert np.array_equal(read(m, OUT, (m_, n_), np.int32), want)


def _requant_draw(data, i32=False):
    return dict(
        mult=data.draw(st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(1, 1 << 16))),
        shift=data.draw(st.integers(0, 62)),
        zp_out=data.draw(st.integers(-128, 127)),
        lo=data.draw(st.integers(-128, 0)),
        hi=data.draw(st.integers(0, 127)),
        **({} if i32 else {"zp_in": data.draw(st.integers(-128, 127))}),
    )


@pytest.mark.parametrize("cfg", CFGS, ids=lambda c: c.name)
@settings(max_examples=40)
@given(data=st.data())
def test_vmap_requantise_int32(cfg, data):
    rows, cols = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 20))
    p = _requant_draw(data, i32=True)
    src_stride = 4 * cols + 4 * data.draw(st.integers(0, 2))
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    x = rng.integers(-(2**31), 2**31, (rows, src_stride // 4), dtype=np.int64).astype(np.int32)
    x[0, 0] = -(2**31)  # saturation edge
    dst_stride = cols + data.draw(st.integers(0, 3))
    instrs = [
        make(
            "load",
            spad=ACC_BASE,
            dram=DATA_BASE,
            rows=1,
            cols=x.nbytes,
            spad_stride=x.nbytes,
            dram_stride=x.nbytes,
        ),
        make(
            "vmap",
            src=ACC_BASE,
            dst=256,
            rows=rows,
            cols=cols,
            src_stride=src_stride,
            dst_stride=dst_stride,
            src_type=1,
            **p,
        ),
        make("store", spad=256, dram=OUT, rows=rows, cols=cols, spad_stride=dst_stride, dram_stride=cols),
    ]
    m = run_instrs(cfg, instrs, {DATA_BASE: x})
    assert_done(m)
    got = read(m, OUT, (rows, cols))
    for r in range(rows):
        for c in range(cols):
            v = clamp(p["zp_out"] + rsr(int(x[r, c]) * p["mult"], p["shift"]), p["lo"], p["hi"])
            assert got[r, c] == v, (r, c)


@settings(max_examples=40)
@given(data=st.data())
def test_vmap_int8_in_place_and_clamp(data):
    cfg = CFGS[1]
    n = data.draw(st.integers(1, 70))
    p = _requant_draw(data)
    x = np.random.default_rng(data.draw(st.integers(0, 99))).integers(-128, 128, n, dtype=np.int8)
    instrs = [
        make("load", spad=64, dram=DATA_BASE, rows=1, cols=n, spad_stride=n, dram_stride=n),
        make("vmap", src=64, dst=64, rows=1, cols=n, src_stride=n, dst_stride=n, **p),
        make("store", spad=64, dram=OUT, rows=1, cols=n, spad_stride=n, dram_stride=n),
    ]
    m = run_instrs(cfg, instrs, {DATA_BASE: x})
    assert_done(m)
    got = read(m, OUT, (n,))
    want = [
        clamp(p["zp_out"] + rsr((int(v) - p["zp_in"]) * p["mult"], p["shift"]), p["lo"], p["hi"]) for v in x
    ]
    assert got.tolist() == want


@settings(max_examples=40)
@given(data=st.data())
def test_vadd(data):
    cfg = CFGS[0]
    n = data.draw(st.integers(0, 50))
    p = dict(
        mult_a=data.draw(st.integers(-(2**31), 2**31 - 1)),
        mult_b=data.draw(st.integers(-(2**31), 2**31 - 1)),
        shift=data.draw(st.integers(0, 62)),
        zp_a=data.draw(st.integers(-128, 127)),
        zp_b=data.draw(st.integers(-128, 127)),
        zp_out=data.draw(st.integers(-128, 127)),
        lo=data.draw(st.integers(-128, 0)),
        hi=data.draw(st.integers(0, 127)),
    )
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    xa, xb = rng.integers(-128, 128, 64, dtype=np.int8), rng.integers(-128, 128, 64, dtype=np.int8)
    in_place = data.draw(st.booleans())
    dst = 0 if in_place else 256
    instrs = [
        make("load", spad=0, dram=DATA_BASE, rows=1, cols=64, spad_stride=64, dram_stride=64),
        make("load", spad=128, dram=DATA_BASE + 64, rows=1, cols=64, spad_stride=64, dram_stride=64),
        make("vadd", a=0, b=128, dst=dst, len=n, **p),
        make("store", spad=dst, dram=OUT, rows=1, cols=64, spad_stride=64, dram_stride=64),
    ]
    m = run_instrs(cfg, instrs, {DATA_BASE: np.concatenate([xa, xb])})
    assert_done(m)
    got = read(m, OUT, (64,))
    for i in range(n):
        s = (int(xa[i]) - p["zp_a"]) * p["mult_a"] + (int(xb[i]) - p["zp_b"]) * p["mult_b"]
        assert got[i] == clamp(p["zp_out"] + rsr(s, p["shift"]), p["lo"], p["hi"])


@pytest.mark.parametrize("cfg", CFGS, ids=lambda c: c.name)
@settings(max_examples=40)
@given(data=st.data())
def test_pool_max_and_avg(cfg, data):
    C = data.draw(st.integers(1, 9))
    kh, kw = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    sh, sw = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    oh, ow = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    W = (ow - 1) * sw + kw + data.draw(st.integers(0, 2))
    H = (oh - 1) * sh + kh
    mode = data.draw(st.integers(0, 1))
    p = _requant_draw(data)
    p["mult"] = data.draw(st.integers(1, 1 << 20))
    x = np.random.default_rng(data.draw(st.integers(0, 99))).integers(-128, 128, (H, W, C), dtype=np.int8)
    dst = 2048
    instrs = [
        make("load", spad=0, dram=DATA_BASE, rows=1, cols=x.size, spad_stride=x.size, dram_stride=x.size),
        make(
            "pool",
            src=0,
            dst=dst,
            channels=C,
            in_w=W,
            out_h=oh,
            out_w=ow,
            kh=kh,
            kw=kw,
            sh=sh,
            sw=sw,
            mode=mode,
            **p,
        ),
        make(
            "store",
            spad=dst,
            dram=OUT,
            rows=1,
            cols=oh * ow * C,
            spad_stride=oh * ow * C,
            dram_stride=oh * ow * C,
        ),
    ]
    m = run_instrs(cfg, instrs, {DATA_BASE: x})
    assert_done(m)
    got = read(m, OUT, (oh, ow, C))
    for y in range(oh):
        for xo in range(ow):
            for c in range(C):
                win = [int(x[y * sh + i, xo * sw + j, c]) for i in range(kh) for j in range(kw)]
                if mode == 0:
                    want = clamp(max(win), p["lo"], p["hi"])
                else:
                    s = sum(win) - kh * kw * p["zp_in"]
                    want = clamp(p["zp_out"] + rsr(s * p["mult"], p["shift"]), p["lo"], p["hi"])
                assert got[y, xo, c] == want


def test_store_from_accumulators_and_overlapping_rows():
    """STORE reads accumulator bytes (a dump is plain DMA); rows are written in order."""
    cfg = CFGS[0]
    x = np.arange(32, dtype=np.uint8)
    instrs = [
        make("load", spad=ACC_BASE + 16, dram=DATA_BASE, rows=1, cols=32, spad_stride=32, dram_stride=32),
        make("store", spad=ACC_BASE + 16, dram=OUT, rows=4, cols=8, spad_stride=8, dram_stride=4),
    ]
    m = run_instrs(cfg, instrs, {DATA_BASE: x})
    assert_done(m)
    want = np.zeros(20, np.uint8)
    for r in range(4):
        want[r * 4 : r * 4 + 8] = x[r * 8 : r * 8 + 8]
    assert read(m, OUT, (20,), np.uint8).tolist() == want.tolist()

"""A convolution's bias as a MATMUL instead of a LOAD.

The accumulators of an output tile start as the bias (the MATMULs then add to them). A LOAD of
the bias row repeated for every pixel (DRAM stride 0) moves 4 bytes an output element, twice an
int16 output's own bytes, on the DMA unit that also brings the inputs. The same start is a
MATMUL of a constant int16 row A (every pixel's row: `a_stride` 0) by a few int8 "digits" per
output channel, with `accumulate` 0: C[i][j] = sum_d A[d] * digit[j][d] = bias[j] exactly. Its
steps are one k step per tile of clusters x PEs outputs: a quarter of the LOAD's bus beats on
`default`, on the matrix unit. The planner (`spatial.plan_conv`) takes it where its block fits
and it takes at most half the LOAD's cycles; a bias the digits cannot hold keeps the LOAD.

A = [1, 256, -32768, -32768, ...]: digit 0 and digit 1 (in -128..127) give the bias modulo
32768 (a residue in -32896..32639, the one leaving the fewest multiples); each further digit adds
up to 127 times -32768.
"""

from __future__ import annotations

import numpy as np

from npu.arith import round_up

#: the A row's int16 elements (at most 8: one lane word of int16 on `default`)
BASE = (1, 256) + (-32768,) * 6
DIGITS = len(BASE)


def digits(bias: np.ndarray) -> np.ndarray | None:
    """(len(bias), k) int8 digits with digits @ BASE[:k] == bias, k >= 2 as small as the largest
    bias needs; None when a bias is beyond what DIGITS digits hold."""
    v = np.asarray(bias, np.int64)
    r = (v + 16384) % 32768 - 16384  # v modulo 32768, in -16384..16383
    # the first two digits reach -32896..32639: the residue one turn further where that leaves
    # fewer multiples of 32768 to the others (16384 is [0, 64], not [0, -64, -1])
    for turn in (32768, -32768):
        alt = r + turn
        ok = (alt >= -32896) & (alt <= 32639) & (np.abs(v - alt) < np.abs(v - r))
        r = np.where(ok, alt, r)
    d1 = (r + 128) // 256  # -128..127
    d0 = r - 256 * d1  # -128..127
    q = (v - r) // -32768  # the multiple of -32768 left
    need = int(np.max(np.abs(q), initial=0) + 126) // 127  # digits of at most 127 each
    if need > DIGITS - 2:
        return None
    k = 2 + need
    out = np.zeros((len(v), k), np.int64)
    out[:, 0], out[:, 1] = d0, d1
    left = q.copy()
    for d in range(2, k):
        step = np.clip(left, -127, 127)
        out[:, d] = step
        left -= step
    assert not left.any() and (out @ np.array(BASE[:k])).tolist() == v.tolist()
    return out.astype(np.int8)


def row_pitch(lanes: int) -> int:
    """Bytes between two output channels' digits (a B^T row: lane-word aligned)."""
    return round_up(DIGITS, lanes)


def block(d: np.ndarray, lanes: int) -> bytes:
    """The on-chip block: the A row (DIGITS int16, padded to a lane word), then each channel's
    digits at `row_pitch`."""
    a = np.zeros(a_bytes(lanes) // 2, "<i2")
    a[: d.shape[1]] = BASE[: d.shape[1]]
    rows = np.zeros((len(d), row_pitch(lanes)), np.int8)
    rows[:, : d.shape[1]] = d
    return a.tobytes() + rows.tobytes()


def a_bytes(lanes: int) -> int:
    """Bytes of the block before the first channel's digits."""
    return round_up(2 * DIGITS, lanes)

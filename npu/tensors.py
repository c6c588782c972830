"""Where each element of a quantised tensor lives in DRAM: the layouts the compiler writes and the
runtime reads (and the `.npub` manifest records).

* `dense`: row-major, contiguous, any rank (matrices, vectors).
* `hwc`: a 4-D NCHW tensor stored as N x H x W x `cp` bytes, `cp` (the channel pitch) a multiple of
  the MAC array's lane count; logical channel c sits at physical channel `chan[c]`. Unused channels
  hold the zero point (the compiler gives them zero weights, so they never change a result).
* `flat`: the 2-D view (N, C*H*W) of an `hwc` tensor (ONNX Flatten/Reshape), no data moved.
* `nhwc`: the channels-last view (N, H, W, C) of an `hwc` tensor: a model input given channels-last
  (its Transpose to NCHW folded by the compiler), no data moved.
* `ncw`: the 3-D view (N, C, W) of an `hwc` tensor of height 1: a 1-D sequence (ONNX Conv1d's
  layout) that the compiler runs as a map of height 1, no data moved.
* `perm`: a transposed view of a dense tensor of shape `base`: logical axis i is axis `perm[i]` of
  it (ONNX Transpose), no data moved (the attention heads a MatMul of two activations reads).

Elements are `elem` bytes: 1 (int8), 2 (int16 little-endian: int16 activations, docs/isa.md) or 4
(int32 little-endian: accumulator values a Gemm or Conv stores for a result only the host reads,
compiler/outputs.py); offsets and sizes count bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arith import round_up

#: element bytes -> numpy type of the stored values
ELEM_TYPES = {1: np.int8, 2: "<i2", 4: "<i4"}


@dataclass(frozen=True)
class Layout:
    kind: str  # "dense" | "hwc" | "flat" | "nhwc" | "ncw" | "perm"
    shape: tuple[int, ...]  # logical shape (for flat: (N, C*H*W); for nhwc: (N, H, W, C))
    nchw: tuple[int, int, int, int] | None = None  # hwc and flat: the 4-D tensor
    cp: int = 0
    chan: tuple[int, ...] = ()
    elem: int = 1  # bytes per element: 1 int8, 2 int16, 4 int32
    base: tuple[int, ...] = ()  # perm: the dense tensor's shape
    perm: tuple[int, ...] = ()  # perm: logical axis i is axis perm[i] of the dense tensor

    @staticmethod
    def transposed(base: tuple[int, ...], perm: tuple[int, ...], elem: int = 1) -> Layout:
        """A dense tensor of shape `base` seen through ONNX Transpose(perm)."""
        base, perm = tuple(int(s) for s in base), tuple(int(p) for p in perm)
        if sorted(perm) != list(range(len(base))):
            raise ValueError(f"perm {list(perm)} is not a permutation of {len(base)} axes")
        return Layout("perm", tuple(base[p] for p in perm), elem=elem, base=base, perm=perm)

    @property
    def strides(self) -> tuple[int, ...]:
        """Bytes between neighbours along each logical axis (dense and perm layouts)."""
        if self.kind not in ("dense", "perm"):
            raise ValueError(f"a {self.kind} tensor has no strides per axis")
        base = self.shape if self.kind == "dense" else self.base
        dense = [self.elem] * len(base)
        for i in range(len(base) - 2, -1, -1):
            dense[i] = dense[i + 1] * base[i + 1]
        return tuple(dense) if self.kind == "dense" else tuple(dense[p] for p in self.perm)

    @staticmethod
    def dense(shape: tuple[int, ...], elem: int = 1) -> Layout:
        if elem not in ELEM_TYPES:
            raise ValueError(f"a dense tensor has 1-, 2- or 4-byte elements, not {elem}")
        return Layout("dense", tuple(int(s) for s in shape), elem=elem)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(ELEM_TYPES[self.elem])

    @staticmethod
    def hwc(
        nchw: tuple[int, ...], align: int, chan: tuple[int, ...] | None = None, cp: int = 0, elem: int = 1
    ) -> Layout:
        n, c, h, w = (int(s) for s in nchw)
        chan = tuple(range(c)) if chan is None else tuple(int(x) for x in chan)
        cp = max(cp, round_up((max(chan, default=-1) + 1), align))
        return Layout("hwc", (n, c, h, w), (n, c, h, w), cp, chan, elem)

    def flatten(self) -> Layout:
        if self.kind != "hwc":
            raise ValueError("only an hwc tensor has a flat view")
        n, c, h, w = self.nchw
        return Layout("flat", (n, c * h * w), self.nchw, self.cp, self.chan, self.elem)

    def channels_last(self) -> Layout:
        """The same bytes seen as an (N, H, W, C) tensor."""
        if self.kind != "hwc":
            raise ValueError("only an hwc tensor has a channels-last view")
        n, c, h, w = self.nchw
        return Layout("nhwc", (n, h, w, c), self.nchw, self.cp, self.chan, self.elem)

    def squeeze_height(self) -> Layout:
        """The same bytes seen as an (N, C, W) sequence (an hwc tensor of height 1)."""
        if self.kind != "hwc" or self.nchw[2] != 1:
            raise ValueError("only an hwc tensor of height 1 has a sequence view")
        n, c, _, w = self.nchw
        return Layout("ncw", (n, c, w), self.nchw, self.cp, self.chan, self.elem)

    @property
    def nbytes(self) -> int:
        if self.kind in ("dense", "perm"):
            return int(np.prod(self.shape)) * self.elem
        n, _, h, w = self.nchw
        return n * h * w * self.cp * self.elem

    @property
    def pixels(self) -> int:
        n, _, h, w = self.nchw
        return n * h * w

    def offsets(self) -> np.ndarray:
        """Byte offset of every logical element, an int64 array of the logical shape."""
        if self.kind == "dense":
            n = int(np.prod(self.shape))
            return np.arange(0, n * self.elem, self.elem, dtype=np.int64).reshape(self.shape)
        if self.kind == "perm":
            n = int(np.prod(self.base))
            return (
                np.arange(0, n * self.elem, self.elem, dtype=np.int64).reshape(self.base).transpose(self.perm)
            )
        n, c, h, w = self.nchw
        pix = np.arange(n * h * w, dtype=np.int64).reshape(n, 1, h, w) * self.cp
        off = (pix + np.asarray(self.chan, np.int64).reshape(1, c, 1, 1)) * self.elem
        if self.kind == "nhwc":
            return off.transpose(0, 2, 3, 1)
        return off.reshape(self.shape)

    def pack(self, q: np.ndarray, fill: int) -> bytes:
        if self.elem == 4:  # int32 tensors are only ever written by the NPU
            raise ValueError("only int8 and int16 tensors are packed by the host")
        q = np.asarray(q, self.dtype)
        if q.shape != self.shape:
            raise ValueError(f"tensor shape {q.shape}, the layout holds {self.shape}")
        buf = np.full(self.nbytes // self.elem, fill, self.dtype)
        buf[self.offsets().reshape(-1) // self.elem] = q.reshape(-1)
        return buf.tobytes()

    def unpack(self, data: bytes) -> np.ndarray:
        """The tensor's values (int8, int16 or int32, by `elem`) from its DRAM bytes."""
        buf = np.frombuffer(data, self.dtype, count=self.nbytes // self.elem)
        return buf[self.offsets() // self.elem].copy()

    def to_json(self) -> dict:
        d = {"kind": self.kind, "shape": list(self.shape)}
        if self.kind == "perm":
            d.update(base=list(self.base), perm=list(self.perm))
        elif self.kind != "dense":
            d.update(nchw=list(self.nchw), cp=self.cp, chan=list(self.chan))
        if self.elem != 1:
            d["elem"] = self.elem
        return d

    @staticmethod
    def from_json(d: dict) -> Layout:
        if d["kind"] == "dense":
            return Layout.dense(tuple(d["shape"]), int(d.get("elem", 1)))
        if d["kind"] == "perm":
            lay = Layout.transposed(tuple(d["base"]), tuple(d["perm"]), int(d.get("elem", 1)))
            if list(lay.shape) != list(d["shape"]):
                raise ValueError(
                    f"a perm layout of shape {d['shape']} that its base and perm make {list(lay.shape)}"
                )
            return lay
        if d["kind"] not in ("hwc", "flat", "nhwc", "ncw"):
            raise ValueError(f"unknown tensor layout kind {d['kind']!r}")
        nchw, elem = tuple(d["nchw"]), int(d.get("elem", 1))
        lay = Layout("hwc", nchw, nchw, int(d["cp"]), tuple(d["chan"]), elem)
        views = {"flat": lay.flatten, "nhwc": lay.channels_last, "ncw": lay.squeeze_height}
        return views.get(d["kind"], lambda: lay)()

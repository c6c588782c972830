"""Lowering of a QDQ int8 ONNX graph to one NPU program (this slice: Gemm, MatMul, Relu).

Every quantised activation lives in DRAM as row-major int8. Each operator becomes a tiled program
fragment (from the shared generators), the fragments are joined by the program builder (which adds
the dependency tokens between them) and a cancellation point follows every operator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from npu.sim.programs import gemm_program

from npu.config import NpuConfig
from npu.program import ProgramBuilder

from .frontend import CompileError, QTensor, initializers, static_shape

ALIGN = 64


def quant_multiplier(real: float, where: str) -> tuple[int, int]:
    """(mult, shift) with mult / 2**shift ~ real, mult < 2**31, 0 <= shift <= 62."""
    if not real > 0 or not math.isfinite(real):
        raise CompileError(f"{where}: requantisation scale {real} is not a positive number")
    m, e = math.frexp(real)  # real = m * 2**e, 0.5 <= m < 1
    mult, shift = round(m * (1 << 31)), 31 - e
    if mult == 1 << 31:
        mult, shift = mult // 2, shift - 1
    while shift > 62:
        mult, shift = (mult + 1) >> 1, shift - 1
    if shift < 0:
        raise CompileError(f"{where}: requantisation scale {real} is too large for the vector unit")
    return max(mult, 1), shift


def add_multipliers(ra: float, rb: float, where: str) -> tuple[int, int, int]:
    """(mult_a, mult_b, shift) with mult_x / 2**shift ~ rx, both below 2**31, one shared shift."""
    for r in (ra, rb):
        if not r > 0 or not math.isfinite(r):
            raise CompileError(f"{where}: rescale factor {r} is not a positive number")
    _, e = math.frexp(max(ra, rb))
    shift = min(62, 31 - e)
    if shift < 0:
        raise CompileError(f"{where}: rescale factor {max(ra, rb)} is too large for the vector unit")
    ma, mb = round(ra * (1 << shift)), round(rb * (1 << shift))
    if max(ma, mb) >= 1 << 31:
        ma, mb, shift = (ma + 1) >> 1, (mb + 1) >> 1, shift - 1
    return ma, mb, shift


@dataclass
class Tensor:
    q: QTensor
    addr: int


@dataclass
class Lowered:
    program: list
    dram: list[tuple[int, bytes]]  # constant images (weights, biases)
    inputs: list[Tensor]
    outputs: list[Tensor]
    input_float_names: list[str]
    output_float_names: list[str]
    layers: list[dict] = field(default_factory=list)
    cancel_points: dict[int, int] = field(default_factory=dict)
    dram_end: int = 0


class _Alloc:
    def __init__(self, start: int, limit: int):
        self.next = start
        self.limit = limit

    def take(self, n: int, what: str) -> int:
        addr = self.next
        self.next = -(-(addr + max(n, 1)) // ALIGN) * ALIGN
        if self.next > self.limit:
            raise CompileError(f"{what}: the model needs more than the {self.limit} bytes of DRAM")
        return addr


def lower(
    model: onnx.ModelProto, cfg: NpuConfig, source: str = "model", cancel_points: bool = True
) -> Lowered:
    g = model.graph
    consts = initializers(model)
    producers = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def where(n) -> str:
        return f"{source}: node {n.name or '?'} ({n.op_type})"

    def scalar(name: str, n) -> float | int:
        if name not in consts:
            raise CompileError(f"{where(n)}: quantisation parameter {name!r} must be a constant")
        return consts[name].reshape(-1)[0].item()

    # quantised tensors: Q outputs (activations) and DQ of constants
    qt: dict[str, QTensor] = {}  # quantised tensor name -> parameters
    for n in g.node:
        if n.op_type == "QuantizeLinear":
            zp = scalar(n.input[2], n) if len(n.input) > 2 and n.input[2] else 0
            if len(n.input) > 2 and n.input[2] and consts[n.input[2]].dtype != np.int8:
                raise CompileError(
                    f"{where(n)}: only int8 activations are supported "
                    f"(zero point type {consts[n.input[2]].dtype})"
                )
            qt[n.output[0]] = QTensor(
                n.output[0], static_shape(model, n.input[0], where(n)), float(scalar(n.input[1], n)), int(zp)
            )

    def dq_source(name: str, n):
        """Source of a DequantizeLinear output: ('act', QTensor) or ('const', array, scale, zp)."""
        p = producers.get(name)
        if p is None or p.op_type != "DequantizeLinear":
            raise CompileError(
                f"{where(n)}: input {name!r} is not quantised (no DequantizeLinear before it); "
                "run the model through the quantiser or give a QDQ model"
            )
        src = p.input[0]
        scale = float(scalar(p.input[1], p))
        zp = int(scalar(p.input[2], p)) if len(p.input) > 2 and p.input[2] else 0
        if src in consts:
            return ("const", consts[src], scale, zp)
        if src not in qt:
            raise CompileError(f"{where(n)}: input {name!r} comes from an unsupported producer")
        return ("act", qt[src])

    def q_consumer(name: str, n) -> QTensor:
        cs = consumers.get(name, [])
        if len(cs) != 1 or cs[0].op_type != "QuantizeLinear":
            raise CompileError(f"{where(n)}: output {name!r} must feed exactly one QuantizeLinear")
        return qt[cs[0].output[0]]

    b = ProgramBuilder(cfg)
    alloc = _Alloc(0x1000, cfg.dram_bytes)
    addr_of: dict[str, int] = {}
    dram: list[tuple[int, bytes]] = []
    layers = []
    cps = 0

    # graph inputs: float -> QuantizeLinear on the host
    inputs, input_names = [], []
    for gi in g.input:
        if gi.name in consts:
            continue
        cs = consumers.get(gi.name, [])
        if len(cs) != 1 or cs[0].op_type != "QuantizeLinear":
            raise CompileError(f"{source}: graph input {gi.name!r} must feed exactly one QuantizeLinear")
        q = qt[cs[0].output[0]]
        addr_of[q.name] = alloc.take(int(np.prod(q.shape)), f"{source}: input {gi.name}")
        inputs.append(Tensor(q, addr_of[q.name]))
        input_names.append(gi.name)

    handled = {"QuantizeLinear", "DequantizeLinear"}
    for n in g.node:
        if n.op_type in handled:
            continue
        if n.op_type in ("Gemm", "MatMul"):
            a_src = dq_source(n.input[0], n)
            w_src = dq_source(n.input[1], n)
            if a_src[0] != "act" or w_src[0] != "const":
                raise CompileError(f"{where(n)}: needs an activation times constant weights")
            a = a_src[1]
            attrs = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
            if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
                raise CompileError(f"{where(n)}: only transA=0, alpha=1, beta=1 are supported")
            w, s_w, zp_w = w_src[1], w_src[2], w_src[3]
            if zp_w != 0 or w.dtype != np.int8:
                raise CompileError(f"{where(n)}: weights must be symmetric int8 (zero point {zp_w})")
            wt = w if attrs.get("transB", 0) else w.T  # B^T: n x k
            if len(a.shape) != 2:
                raise CompileError(f"{where(n)}: activation must be 2-D, has shape {a.shape}")
            m_, k_ = a.shape
            n_ = wt.shape[0]
            if wt.shape[1] != k_:
                raise CompileError(f"{where(n)}: inner dimensions {k_} and {wt.shape[1]} differ")
            bias = np.zeros(n_, np.int64)
            if n.op_type == "Gemm" and len(n.input) > 2 and n.input[2]:
                c_src = dq_source(n.input[2], n)
                if c_src[0] != "const" or c_src[1].dtype != np.int32:
                    raise CompileError(f"{where(n)}: bias must be a quantised int32 constant")
                rel = abs(c_src[2] - a.scale * s_w) / (a.scale * s_w)
                if rel > 1e-3:
                    raise CompileError(f"{where(n)}: bias scale {c_src[2]} is not input scale x weight scale")
                bias = c_src[1].astype(np.int64).reshape(-1)
            # fold the activation zero point: sum (a - za) w = sum a w - za sum w
            bias = bias - a.zero_point * wt.astype(np.int64).sum(axis=1)
            if np.abs(bias).max(initial=0) >= 2**31:
                raise CompileError(f"{where(n)}: folded bias overflows int32")
            out = q_consumer(n.output[0], n)
            mult, shift = quant_multiplier(a.scale * s_w / out.scale, where(n))
            w_addr = alloc.take(wt.size, f"{where(n)} weights")
            bias_addr = alloc.take(4 * n_, f"{where(n)} bias")
            dram.append((w_addr, np.ascontiguousarray(wt, np.int8).tobytes()))
            dram.append((bias_addr, bias.astype("<i4").tobytes()))
            addr_of[out.name] = alloc.take(m_ * n_, f"{where(n)} output")
            first = len(b)
            gemm_program(
                cfg,
                m_,
                n_,
                k_,
                addr_of[a.name],
                w_addr,
                addr_of[out.name],
                mult=mult,
                shift=shift,
                zp_out=out.zero_point,
                bias_addr=bias_addr,
                builder=b,
            )
            layers.append({"node": n.name, "op": n.op_type, "shape": [m_, n_, k_], "items": [first, len(b)]})
        elif n.op_type == "Relu":
            src = dq_source(n.input[0], n)
            if src[0] != "act":
                raise CompileError(f"{where(n)}: Relu of a constant")
            x = src[1]
            out = q_consumer(n.output[0], n)
            mult, shift = quant_multiplier(x.scale / out.scale, where(n))
            addr_of[out.name] = alloc.take(int(np.prod(x.shape)), f"{where(n)} output")
            first = len(b)
            _eltwise(
                b,
                cfg,
                addr_of[x.name],
                addr_of[out.name],
                int(np.prod(x.shape)),
                dict(
                    mult=mult,
                    shift=shift,
                    zp_in=x.zero_point,
                    zp_out=out.zero_point,
                    lo=max(-128, out.zero_point),
                    hi=127,
                ),
            )
            layers.append({"node": n.name, "op": "Relu", "shape": list(x.shape), "items": [first, len(b)]})
        elif n.op_type == "Add":
            srcs = [dq_source(i, n) for i in n.input]
            if any(sr[0] != "act" for sr in srcs):
                raise CompileError(f"{where(n)}: Add of a constant is not supported yet")
            xa, xb = srcs[0][1], srcs[1][1]
            if xa.shape != xb.shape:
                raise CompileError(f"{where(n)}: broadcasting Add ({xa.shape} + {xb.shape}) is not supported")
            out = q_consumer(n.output[0], n)
            ma, mb, shift = add_multipliers(xa.scale / out.scale, xb.scale / out.scale, where(n))
            count = int(np.prod(xa.shape))
            addr_of[out.name] = alloc.take(count, f"{where(n)} output")
            first = len(b)
            _add(
                b,
                cfg,
                addr_of[xa.name],
                addr_of[xb.name],
                addr_of[out.name],
                count,
                dict(
                    mult_a=ma,
                    mult_b=mb,
                    shift=shift,
                    zp_a=xa.zero_point,
                    zp_b=xb.zero_point,
                    zp_out=out.zero_point,
                ),
            )
            layers.append({"node": n.name, "op": "Add", "shape": list(xa.shape), "items": [first, len(b)]})
        else:
            raise CompileError(f"{where(n)}: operator {n.op_type} is not supported by this compiler yet")
        if cancel_points:
            b.cancel_point(cps)
            cps += 1

    # graph outputs: DequantizeLinear on the host
    outputs, output_names = [], []
    for go in g.output:
        p = producers.get(go.name)
        if p is None or p.op_type != "DequantizeLinear" or p.input[0] not in qt:
            raise CompileError(f"{source}: graph output {go.name!r} must come from a DequantizeLinear")
        q = qt[p.input[0]]
        outputs.append(Tensor(q, addr_of[q.name]))
        output_names.append(go.name)
    built = b.build()
    return Lowered(
        built.instrs,
        dram,
        inputs,
        outputs,
        input_names,
        output_names,
        layers,
        built.cancel_points,
        alloc.next,
    )


def _eltwise(b: ProgramBuilder, cfg: NpuConfig, src: int, dst: int, n: int, params: dict) -> None:
    """An int8 element-wise VMAP over n contiguous bytes, in chunks that fit the scratchpad."""
    chunk = max(cfg.bus_bytes, (cfg.spad_bytes // 4) // cfg.bus_bytes * cfg.bus_bytes)
    bufs = [0, chunk]
    for i, off in enumerate(range(0, n, chunk)):
        c = min(chunk, n - off)
        buf = bufs[i % 2]
        b.add("load", spad=buf, dram=src + off, rows=1, cols=c, spad_stride=c, dram_stride=c)
        b.add("vmap", src=buf, dst=buf, rows=1, cols=c, src_stride=c, dst_stride=c, **params)
        b.add("store", spad=buf, dram=dst + off, rows=1, cols=c, spad_stride=c, dram_stride=c)


def _add(b: ProgramBuilder, cfg: NpuConfig, a: int, bb: int, dst: int, n: int, params: dict) -> None:
    """VADD over n contiguous int8 elements of two tensors, in chunks that fit the scratchpad."""
    chunk = max(cfg.bus_bytes, (cfg.spad_bytes // 6) // cfg.bus_bytes * cfg.bus_bytes)
    for i, off in enumerate(range(0, n, chunk)):
        c = min(chunk, n - off)
        base = (i % 2) * 2 * chunk
        b.add("load", spad=base, dram=a + off, rows=1, cols=c, spad_stride=c, dram_stride=c)
        b.add("load", spad=base + chunk, dram=bb + off, rows=1, cols=c, spad_stride=c, dram_stride=c)
        b.add("vadd", a=base, b=base + chunk, dst=base, len=c, **params)
        b.add("store", spad=base, dram=dst + off, rows=1, cols=c, spad_stride=c, dram_stride=c)

"""Lowering of a QDQ int8 ONNX graph to NPU programs and host steps.

Every quantised activation lives in DRAM (`npu.tensors.Layout`: HWC with a padded channel pitch for
4-D tensors, row-major otherwise). Each NPU operator becomes a tiled program fragment; fragments are
joined by the program builder (which adds the dependency tokens) and a cancellation point follows
every operator. Operators the NPU does not run become host steps (evaluated with `onnx.reference` on
dequantised data); a host step ends the current NPU segment, so a model is a sequence of segments:
NPU program ranges (each ending in END) and host steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from npu.arith import round_up
from npu.compiler.programs import gemm_program
from npu.config import ACC_BASE, NpuConfig
from npu.container import CancelPoint, HostIO, HostStep, HostTensor, Layer, NpuSegment, Segment, TensorDesc
from npu.isa import Instr, Opcode, footprint
from npu.program import ProgramBuilder
from npu.sim.runner import timing_run
from npu.tensors import Layout
from npu.timing import bank_stride, duration

from .elementwise import add_program, concat_program, eltwise_program
from .frontend import Act, CompileError, QTensor, initializers, node_attrs, static_shape
from .points import SPILL_POINTS, Candidate, PointPolicy, choose, dma_cycles, fragment_liveness
from .spatial import channel_align, conv_program, geometry, pool_program

ALIGN = 64
VIEW_OPS = {"Flatten", "Reshape"}


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


def tensor_desc(name: str, a: Act) -> TensorDesc:
    return TensorDesc(name, list(a.q.shape), a.q.scale, a.q.zero_point, a.addr, a.layout)


@dataclass
class Lowered:
    program: list[Instr]
    dram: list[tuple[int, bytes]]  # constant images (weights, biases)
    inputs: list[TensorDesc]
    outputs: list[TensorDesc | HostTensor]
    segments: list[Segment]
    layers: list[Layer] = field(default_factory=list)
    host_models: dict[str, bytes] = field(default_factory=dict)
    dram_end: int = 0
    order: list[int] = field(default_factory=list)  # fragment indices in program order
    points: list[CancelPoint] = field(default_factory=list)  # the cancellation point table
    candidates: list[dict] = field(default_factory=list)  # every place a point could have gone

    @property
    def cancel_points(self) -> dict[int, int]:
        """Point id -> pc."""
        return {p.id: p.pc for p in self.points}


@dataclass
class Frag:
    """One operator, lowered once: its program items (NPU) or its host step, and what it depends on."""

    index: int
    kind: str  # "npu" | "host" | "view"
    layer: Layer
    deps: set[int]
    items: list = field(default_factory=list)  # ProgramBuilder items
    host: HostStep | None = None
    host_model: bytes = b""
    _top: list | None = field(default=None, repr=False)

    def placed(self, top: bool, cfg: NpuConfig) -> list:
        """The items at the bottom of the on-chip memories, or moved to the top (computed once)."""
        if not top:
            return self.items
        if self._top is None:
            self._top = _relocate_top(self.items, cfg)
        return self._top


@dataclass
class Lowering:
    """Every operator lowered, not yet ordered; `assemble` turns an order into programs."""

    cfg: NpuConfig
    frags: list[Frag]
    dram: list[tuple[int, bytes]]
    inputs: list[TensorDesc]
    outputs: list[TensorDesc | HostTensor]
    dram_end: int

    def assemble(self, order: list[int] | None = None, policy: PointPolicy | None = SPILL_POINTS) -> Lowered:
        return assemble(self, list(range(len(self.frags))) if order is None else order, policy)


class _Alloc:
    def __init__(self, start: int, limit: int):
        self.next = start
        self.limit = limit

    def take(self, n: int, what: str) -> int:
        addr = self.next
        self.next = round_up((addr + max(n, 1)), ALIGN)
        if self.next > self.limit:
            raise CompileError(f"{what}: the model needs more than the {self.limit} bytes of DRAM")
        return addr


class _Lowering:
    def __init__(self, model: onnx.ModelProto, cfg: NpuConfig, source: str, step: int = 0, max_live: int = 0):
        self.model, self.cfg, self.source = model, cfg, source
        self.max_live = max_live or cfg.spad_bytes // 4
        # operator steps (bands, tiles, chunks) are kept to half the cancellation interval, which
        # leaves room for the loads that start a step and for cost-model error
        self.step = step // 2
        g = model.graph
        self.consts = initializers(model)
        self.producers = {o: n for n in g.node for o in n.output}
        self.consumers: dict[str, list] = {}
        for n in g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.ca = channel_align(cfg)
        self.alloc = _Alloc(0x1000, cfg.dram_bytes)
        self.dram: list[tuple[int, bytes]] = []
        self.acts: dict[str, Act] = {}  # Q output name -> placed tensor
        self.qt: dict[str, QTensor] = {}
        self.host_float: set[str] = set()  # float tensors computed by host steps
        self.frags: list[Frag] = []
        self.frag_of: dict[str, int] = {}  # float tensor name -> producing fragment
        for n in g.node:
            if n.op_type == "QuantizeLinear":
                zp_name = n.input[2] if len(n.input) > 2 else ""
                if zp_name and self.consts[zp_name].dtype != np.int8:
                    raise CompileError(
                        f"{self.where(n)}: only int8 activations are supported "
                        f"(zero point type {self.consts[zp_name].dtype})"
                    )
                zp = self.scalar(zp_name, n) if zp_name else 0
                self.qt[n.output[0]] = QTensor(
                    n.output[0], self.shape(n.input[0], n), float(self.scalar(n.input[1], n)), int(zp)
                )

    # -- helpers ------------------------------------------------------------------------------
    def where(self, n) -> str:
        return f"{self.source}: node {n.name or '?'} ({n.op_type})"

    def shape(self, name: str, n) -> tuple[int, ...]:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        return static_shape(self.model, name, self.where(n))

    def scalar(self, name: str, n) -> float | int:
        if name not in self.consts:
            raise CompileError(f"{self.where(n)}: quantisation parameter {name!r} must be a constant")
        v = self.consts[name]
        if v.size != 1:
            raise CompileError(
                f"{self.where(n)}: per-channel quantisation ({name!r} has {v.size} values) is not supported; "
                "quantise per tensor"
            )
        return v.reshape(-1)[0].item()

    def dq_source(self, name: str, n):
        """('act', Act) or ('const', int array, scale, zp) for a DequantizeLinear output."""
        p = self.producers.get(name)
        if p is None or p.op_type != "DequantizeLinear":
            raise CompileError(
                f"{self.where(n)}: input {name!r} is not quantised (no DequantizeLinear before it); "
                "run the model through the quantiser or give a QDQ model"
            )
        src = p.input[0]
        scale = float(self.scalar(p.input[1], p))
        zp = int(self.scalar(p.input[2], p)) if len(p.input) > 2 and p.input[2] else 0
        if src in self.consts:
            return ("const", self.consts[src], scale, zp)
        if src not in self.acts:
            raise CompileError(f"{self.where(n)}: input {name!r} comes from an unsupported producer")
        return ("act", self.acts[src])

    def act_in(self, name: str, n) -> Act:
        s = self.dq_source(name, n)
        if s[0] != "act":
            raise CompileError(f"{self.where(n)}: input {name!r} is a constant; an activation is needed")
        return s[1]

    def q_out(self, name: str, n) -> QTensor:
        cs = self.consumers.get(name, [])
        if len(cs) != 1 or cs[0].op_type != "QuantizeLinear":
            raise CompileError(f"{self.where(n)}: output {name!r} must feed exactly one QuantizeLinear")
        return self.qt[cs[0].output[0]]

    def place(self, q: QTensor, what: str, layout: Layout | None = None) -> Act:
        if layout is None:
            if len(q.shape) == 4:
                cp = bank_stride(self.cfg, round_up(q.shape[1], self.ca), self.ca)
                layout = Layout.hwc(q.shape, self.ca, cp=cp)
            else:
                layout = Layout.dense(q.shape)
        a = Act(q, self.alloc.take(layout.nbytes, what), layout)
        self.acts[q.name] = a
        return a

    def const(self, data: bytes, what: str) -> int:
        addr = self.alloc.take(len(data), what)
        self.dram.append((addr, data))
        return addr

    # -- fragments ----------------------------------------------------------------------------
    def _trace(self, name: str) -> str:
        """The tensor a (possibly quantised) value comes from, through DequantizeLinear/QuantizeLinear."""
        for _ in range(4):
            p = self.producers.get(name)
            if p is None or p.op_type not in ("QuantizeLinear", "DequantizeLinear"):
                return name
            name = p.input[0]
        return name

    def new_frag(self, n, kind: str, shape, info: dict | None = None) -> Frag:
        sources = {self._trace(x) for x in n.input if x}
        deps = {self.frag_of[t] for t in sources if t in self.frag_of}
        f = Frag(len(self.frags), kind, Layer(n.name, n.op_type, kind, list(shape), **(info or {})), deps)
        self.frags.append(f)
        for o in n.output:
            self.frag_of[o] = f.index
        return f

    def op_done(self, n, b: ProgramBuilder, shape, info: dict | None = None) -> None:
        self.new_frag(n, "npu", shape, info).items = list(b._items)

    # -- the graph ----------------------------------------------------------------------------
    def run(self) -> Lowering:
        g = self.model.graph
        inputs = []
        for gi in g.input:
            if gi.name in self.consts:
                continue
            qs = [c for c in self.consumers.get(gi.name, []) if c.op_type == "QuantizeLinear"]
            if len(qs) != 1:
                raise CompileError(
                    f"{self.source}: graph input {gi.name!r} must feed exactly one QuantizeLinear"
                )
            a = self.place(self.qt[qs[0].output[0]], f"{self.source}: input {gi.name}")
            inputs.append(tensor_desc(gi.name, a))
        for n in g.node:
            if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
                continue
            reason = self.npu_reason(n)
            if reason is None:
                self.lower_npu(n)
            else:
                self.lower_host(n, reason)
        outputs = []
        for go in g.output:
            p = self.producers.get(go.name)
            if p is not None and p.op_type == "DequantizeLinear" and p.input[0] in self.acts:
                outputs.append(tensor_desc(go.name, self.acts[p.input[0]]))
            elif go.name in self.host_float:
                outputs.append(HostTensor(go.name, list(self.shape(go.name, p))))
            else:
                raise CompileError(
                    f"{self.source}: graph output {go.name!r} must come from a DequantizeLinear "
                    "or a host step"
                )
        return Lowering(self.cfg, self.frags, self.dram, inputs, outputs, self.alloc.next)

    # -- placement ----------------------------------------------------------------------------
    def npu_reason(self, n) -> str | None:
        """None when the NPU runs this node, else why it goes to the host."""
        op, a = n.op_type, node_attrs(n)
        if n.domain not in ("", "ai.onnx"):
            return f"custom domain {n.domain}"
        if any(i in self.host_float for i in n.input if i):
            return "its input is computed on the host"
        if op in (
            "Conv",
            "Gemm",
            "MatMul",
            "Relu",
            "Clip",
            "Add",
            "Sum",
            "Concat",
            "MaxPool",
            "AveragePool",
            "GlobalAveragePool",
            "Flatten",
            "Reshape",
        ):
            if op in ("MaxPool", "AveragePool"):
                if a.get("ceil_mode", 0) or any(d != 1 for d in a.get("dilations", [1, 1])):
                    return "ceil_mode or dilation"
                if op == "AveragePool" and any(a.get("pads", [0])) and not a.get("count_include_pad", 0):
                    return "average pooling that excludes padding"
            if op in ("Add", "Sum"):
                ins = [i for i in n.input if i]
                if len(ins) != 2 or any(self.src_kind(i) != "act" for i in ins):
                    return "only the sum of two activations runs on the NPU"
                if self.act_in(ins[0], n).layout != self.act_in(ins[1], n).layout:
                    return "operands of different shapes or layouts (broadcasting)"
            if op == "Concat":
                ins = [self.act_in(i, n) for i in n.input]
                rank = len(ins[0].q.shape)
                if a.get("axis") not in (1, 1 - rank) or rank not in (2, 4):
                    return "concatenation on an axis other than channels"
            if op in VIEW_OPS:
                return self.view_reason(n)
            return None
        return "no NPU lowering for this operator"

    def src_kind(self, name: str) -> str:
        p = self.producers.get(name)
        if p is not None and p.op_type == "DequantizeLinear":
            return "const" if p.input[0] in self.consts else "act"
        return "float"

    def view_reason(self, n) -> str | None:
        x = self.act_in(n.input[0], n)
        out = self.q_out(n.output[0], n)
        if (out.scale, out.zero_point) != (x.q.scale, x.q.zero_point):
            return "a reshape that changes quantisation"
        lay = x.layout
        if lay.kind == "dense" or tuple(out.shape) == tuple(lay.shape):
            return None
        if lay.kind == "hwc" and tuple(out.shape) == lay.flatten().shape:
            return None
        return "a reshape that moves data"

    # -- NPU operators --------------------------------------------------------------------------
    def lower_npu(self, n) -> None:
        op = n.op_type
        if op in VIEW_OPS:  # no data moves: the output is a new view of the input's bytes
            x = self.act_in(n.input[0], n)
            out = self.q_out(n.output[0], n)
            lay = x.layout
            if lay.kind == "dense":
                lay = Layout.dense(out.shape)
            elif tuple(out.shape) != tuple(lay.shape):
                lay = lay.flatten()
            self.acts[out.name] = Act(out, x.addr, lay)
            self.new_frag(n, "view", out.shape)
            return
        getattr(self, "_" + op.lower())(n, ProgramBuilder(self.cfg))

    def _requant_params(self, x: QTensor, y: QTensor, n, lo: float | None = None, hi: float | None = None):
        mult, shift = quant_multiplier(x.scale / y.scale, self.where(n))
        lo_q = -128 if lo is None else int(np.clip(np.rint(lo / y.scale) + y.zero_point, -128, 127))
        hi_q = 127 if hi is None else int(np.clip(np.rint(hi / y.scale) + y.zero_point, -128, 127))
        return dict(mult=mult, shift=shift, zp_in=x.zero_point, zp_out=y.zero_point, lo=lo_q, hi=hi_q)

    def _weights(self, name: str, n) -> tuple[np.ndarray, float]:
        s = self.dq_source(name, n)
        if s[0] != "const":
            raise CompileError(f"{self.where(n)}: weights {name!r} must be constant")
        w, scale, zp = s[1], s[2], s[3]
        if zp != 0 or w.dtype != np.int8:
            raise CompileError(
                f"{self.where(n)}: weights must be symmetric int8 (zero point {zp}, {w.dtype})"
            )
        return w, scale

    def _bias(self, n, index: int, count: int, x: Act, s_w: float) -> np.ndarray:
        if len(n.input) <= index or not n.input[index]:
            return np.zeros(count, np.int64)
        s = self.dq_source(n.input[index], n)
        if s[0] != "const" or s[1].dtype != np.int32:
            raise CompileError(f"{self.where(n)}: bias must be a quantised int32 constant")
        if abs(s[2] - x.q.scale * s_w) > 1e-3 * x.q.scale * s_w:
            raise CompileError(f"{self.where(n)}: bias scale {s[2]} is not input scale x weight scale")
        return s[1].astype(np.int64).reshape(-1)

    def _conv(self, n, b: ProgramBuilder) -> None:
        a = node_attrs(n)
        x = self.act_in(n.input[0], n)
        w, s_w = self._weights(n.input[1], n)
        if w.ndim != 4 or x.layout.kind != "hwc":
            raise CompileError(f"{self.where(n)}: only 2-D convolutions (NCHW) are supported")
        if any(d != 1 for d in a.get("dilations", [1, 1])):
            raise CompileError(f"{self.where(n)}: dilated convolution is not supported")
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise CompileError(f"{self.where(n)}: auto_pad is not supported; give explicit pads")
        groups = a.get("group", 1)
        cout, cin_g, kh, kw = w.shape
        if cin_g * groups != x.q.shape[1] or cout % groups:
            raise CompileError(
                f"{self.where(n)}: weights {w.shape} do not match {x.q.shape[1]} channels, {groups} groups"
            )
        bias = self._bias(n, 2, cout, x, s_w) - x.q.zero_point * w.astype(np.int64).sum(axis=(1, 2, 3))
        if np.abs(bias).max(initial=0) >= 2**31:
            raise CompileError(f"{self.where(n)}: folded bias overflows int32")
        yq = self.q_out(n.output[0], n)
        y = self.place(yq, f"{self.where(n)} output")
        geo = geometry(x, y, (kh, kw), a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0]), self.where(n))
        mult, shift = quant_multiplier(x.q.scale * s_w / yq.scale, self.where(n))
        rq = dict(mult=mult, shift=shift, zp_out=yq.zero_point, lo=-128, hi=127)
        info = conv_program(
            b, self.cfg, x, y, w, bias, groups, geo, rq, self.const, self.where(n), self.step, self.max_live
        )
        self.op_done(n, b, yq.shape, info)

    def _gemm(self, n, b: ProgramBuilder) -> None:
        x = self.act_in(n.input[0], n)
        w, s_w = self._weights(n.input[1], n)
        a = node_attrs(n)
        if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
            raise CompileError(f"{self.where(n)}: only transA=0, alpha=1, beta=1 are supported")
        if len(x.q.shape) != 2 or w.ndim != 2:
            raise CompileError(f"{self.where(n)}: activation must be 2-D, has shape {x.q.shape}")
        wt = w if a.get("transB", 0) else w.T  # B^T: n x k
        m_, k_ = x.q.shape
        n_ = wt.shape[0]
        if wt.shape[1] != k_:
            raise CompileError(f"{self.where(n)}: inner dimensions {k_} and {wt.shape[1]} differ")
        bias = self._bias(n, 2, n_, x, s_w) if n.op_type == "Gemm" else np.zeros(n_, np.int64)
        # fold the activation zero point: sum (a - za) w = sum a w - za sum w
        bias = bias - x.q.zero_point * wt.astype(np.int64).sum(axis=1)
        if np.abs(bias).max(initial=0) >= 2**31:
            raise CompileError(f"{self.where(n)}: folded bias overflows int32")
        # the activation's physical row: a flat view of an HWC tensor permutes (and pads) columns
        if x.layout.kind == "flat":
            k_phys = x.layout.nbytes // m_
            perm = x.layout.offsets()[0]
            wp = np.zeros((n_, k_phys), np.int8)
            wp[:, perm] = wt
            wt = wp
        yq = self.q_out(n.output[0], n)
        mult, shift = quant_multiplier(x.q.scale * s_w / yq.scale, self.where(n))
        w_addr = self.const(np.ascontiguousarray(wt, np.int8).tobytes(), f"{self.where(n)} weights")
        bias_addr = self.const(bias.astype("<i4").tobytes(), f"{self.where(n)} bias")
        y = self.place(yq, f"{self.where(n)} output")
        gemm_program(
            self.cfg,
            m_,
            n_,
            wt.shape[1],
            x.addr,
            w_addr,
            y.addr,
            mult=mult,
            shift=shift,
            zp_out=yq.zero_point,
            bias_addr=bias_addr,
            builder=b,
        )
        self.op_done(n, b, [m_, n_, k_])

    _matmul = _gemm

    def _unit(self, lay: Layout) -> int:
        return (
            lay.cp if lay.kind != "dense" else (lay.shape[-1] if lay.shape and lay.shape[-1] <= 4096 else 1)
        )

    def _relu(self, n, b: ProgramBuilder) -> None:
        self._clamp(n, b, 0.0, None)

    def _clip(self, n, b: ProgramBuilder) -> None:
        a = node_attrs(n)
        lo, hi = a.get("min"), a.get("max")
        for idx in (1, 2):
            if len(n.input) > idx and n.input[idx]:
                name = n.input[idx]
                if name in self.consts:
                    v = float(self.consts[name].reshape(-1)[0])
                elif self.src_kind(name) == "const":
                    s = self.dq_source(name, n)
                    v = (float(s[1].reshape(-1)[0]) - s[3]) * s[2]
                else:
                    raise CompileError(f"{self.where(n)}: Clip bounds must be constants")
                lo, hi = (v, hi) if idx == 1 else (lo, v)
        self._clamp(n, b, lo, hi)

    def _clamp(self, n, b, lo, hi) -> None:
        x = self.act_in(n.input[0], n)
        yq = self.q_out(n.output[0], n)
        y = self.place(yq, f"{self.where(n)} output", x.layout)
        eltwise_program(
            b,
            self.cfg,
            x.addr,
            y.addr,
            x.nbytes,
            self._requant_params(x.q, yq, n, lo, hi),
            self._unit(x.layout),
            self.step,
        )
        self.op_done(n, b, yq.shape)

    def _add(self, n, b: ProgramBuilder) -> None:
        xa, xb = (self.act_in(i, n) for i in n.input if i)
        yq = self.q_out(n.output[0], n)
        y = self.place(yq, f"{self.where(n)} output", xa.layout)
        ma, mb, shift = add_multipliers(xa.q.scale / yq.scale, xb.q.scale / yq.scale, self.where(n))
        params = dict(
            mult_a=ma,
            mult_b=mb,
            shift=shift,
            zp_a=xa.q.zero_point,
            zp_b=xb.q.zero_point,
            zp_out=yq.zero_point,
        )
        add_program(
            b, self.cfg, xa.addr, xb.addr, y.addr, xa.nbytes, params, self._unit(xa.layout), self.step
        )
        self.op_done(n, b, yq.shape)

    _sum = _add

    def _concat(self, n, b: ProgramBuilder) -> None:
        xs = [self.act_in(i, n) for i in n.input]
        yq = self.q_out(n.output[0], n)
        parts, off, chan = [], 0, []
        for x in xs:
            rescale = None
            if (x.q.scale, x.q.zero_point) != (yq.scale, yq.zero_point):
                rescale = self._requant_params(x.q, yq, n)
            width = x.layout.cp if x.layout.kind == "hwc" else x.q.shape[1]
            if x.layout.kind == "hwc":
                chan.extend(off + c for c in x.layout.chan)
            parts.append((x, width, off, rescale))
            off += width
        if len(yq.shape) == 4:
            layout = Layout.hwc(yq.shape, self.ca, tuple(chan), bank_stride(self.cfg, off, self.ca))
            pixels = layout.pixels
        else:
            layout, pixels = Layout.dense(yq.shape), yq.shape[0]
        y = self.place(yq, f"{self.where(n)} output", layout)
        concat_program(b, self.cfg, parts, y, pixels, self.step)
        self.op_done(n, b, yq.shape)

    def _pool(self, n, b: ProgramBuilder, kernel, strides, pads, mode: int) -> None:
        x = self.act_in(n.input[0], n)
        if x.layout.kind != "hwc":
            raise CompileError(f"{self.where(n)}: pooling needs a 4-D NCHW input")
        yq = self.q_out(n.output[0], n)
        y = self.place(
            yq, f"{self.where(n)} output", Layout.hwc(yq.shape, self.ca, x.layout.chan, x.layout.cp)
        )
        geo = geometry(x, y, kernel, strides, pads, self.where(n))
        rescale = None
        if mode == 0:
            rq = dict(mult=1, shift=0, zp_in=0, zp_out=0, lo=-128, hi=127)
            if (x.q.scale, x.q.zero_point) != (yq.scale, yq.zero_point):
                rescale = self._requant_params(x.q, yq, n)
        else:
            mult, shift = quant_multiplier(x.q.scale / (yq.scale * kernel[0] * kernel[1]), self.where(n))
            rq = dict(mult=mult, shift=shift, zp_in=x.q.zero_point, zp_out=yq.zero_point, lo=-128, hi=127)
        info = pool_program(b, self.cfg, x, y, geo, mode, rq, rescale, self.where(n), self.step)
        self.op_done(n, b, yq.shape, info)

    def _maxpool(self, n, b) -> None:
        a = node_attrs(n)
        k = a["kernel_shape"]
        self._pool(n, b, k, a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0]), 0)

    def _averagepool(self, n, b) -> None:
        a = node_attrs(n)
        k = a["kernel_shape"]
        self._pool(n, b, k, a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0]), 1)

    def _globalaveragepool(self, n, b) -> None:
        _, _, h, w = self.act_in(n.input[0], n).q.shape
        self._pool(n, b, [h, w], [1, 1], [0, 0, 0, 0], 1)

    # -- host steps ---------------------------------------------------------------------------
    def lower_host(self, n, reason: str) -> None:
        """One host step: the node as a small float ONNX graph, fed from DRAM (dequantised), from
        constants or from earlier host results; results feeding a QuantizeLinear go back to DRAM."""
        if n.domain not in ("", "ai.onnx"):
            raise CompileError(
                f"{self.where(n)}: operator {n.domain}.{n.op_type} cannot run on the NPU or the host"
            )
        g_inputs, inits, inputs, quantize, seen = [], [], [], [], set()
        graph_inputs = {i.name for i in self.model.graph.input}
        for name in n.input:
            if not name or name in seen:
                continue
            seen.add(name)
            kind = self.src_kind(name)
            if name in self.consts:
                inits.append(numpy_helper.from_array(self.consts[name], name))
            elif kind == "const":
                _, v, scale, zp = self.dq_source(name, n)
                inits.append(numpy_helper.from_array(((v.astype(np.float32) - zp) * scale), name))
            elif kind == "act":
                a = self.act_in(name, n)
                g_inputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(a.q.shape)))
                inputs.append(HostIO(name, tensor_desc(a.q.name, a)))
            elif name in self.host_float or name in graph_inputs:
                shape = self.shape(name, n)
                g_inputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(shape)))
                inputs.append(HostIO(name, None))
            else:
                raise CompileError(f"{self.where(n)}: input {name!r} has no producer the compiler knows")
        g_outputs = []
        for o in n.output:
            if not o:
                continue
            self.host_float.add(o)
            g_outputs.append(helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, list(self.shape(o, n))))
            for c in self.consumers.get(o, []):
                if c.op_type == "QuantizeLinear":
                    q = self.qt[c.output[0]]
                    a = self.place(q, f"{self.where(c)} output")
                    quantize.append(HostIO(o, tensor_desc(q.name, a)))
        name = f"host{len(self.frags)}"
        m = helper.make_model(
            helper.make_graph([n], name, g_inputs, g_outputs, inits),
            opset_imports=list(self.model.opset_import),
        )
        m.ir_version = self.model.ir_version
        try:
            ReferenceEvaluator(m)
        except Exception as e:
            raise CompileError(
                f"{self.where(n)}: the NPU does not run {n.op_type} and the host cannot either ({e})"
            ) from None
        f = self.new_frag(n, "host", self.shape(n.output[0], n), {"reason": reason})
        f.host = HostStep(name, inputs, quantize, [f"{n.name} ({n.op_type})"])
        f.host_model = m.SerializeToString()


def _estimate(instrs: list[Instr], cfg: NpuConfig) -> tuple[int, int, int]:
    """Cost-model figures of an instruction range: compute and DMA busy cycles and a runtime estimate."""
    busy = {"load": 0, "matrix": 0, "vector": 0, "store": 0}
    for i in instrs:
        if i.unit is not None:
            busy[i.unit.name.lower()] += duration(i, cfg)
    compute = max(busy["matrix"], busy["vector"])
    dma = busy["load"] + busy["store"]
    return compute, dma, max(compute, busy["load"], busy["store"])


_ADDR_FIELDS = {
    Opcode.LOAD: ("spad",),
    Opcode.STORE: ("spad",),
    Opcode.MATMUL: ("a", "b", "c"),
    Opcode.VMAP: ("src", "dst"),
    Opcode.VADD: ("a", "b", "dst"),
    Opcode.POOL: ("src", "dst"),
}


def _relocate_top(items: list, cfg: NpuConfig) -> list:
    """The same fragment with its on-chip buffers moved to the top of the scratchpad and of the
    accumulators, so that consecutive operators use disjoint buffers where they fit and may overlap.
    A banked scratchpad's two halves move separately (weights stay in the upper half)."""
    half = cfg.spad_bytes // 2 if cfg.spad_banked else cfg.spad_bytes
    regions = [(0, half), (half, cfg.spad_bytes)] if cfg.spad_banked else [(0, cfg.spad_bytes)]
    ends = [lo for lo, _ in regions]
    acc_end = 0
    for it in items:
        if it.kind != "instr":
            continue
        reads, writes = footprint(it.instr)
        for sp in reads + writes:
            if sp.space == "onchip":
                if sp.start >= ACC_BASE:
                    acc_end = max(acc_end, sp.end - ACC_BASE)
                else:
                    r = 0 if sp.start < half else 1
                    ends[r] = max(ends[r], sp.end)
    # a buffer that runs past its region's end pins the region (shift 0)
    shifts = [max(0, hi - end) // ALIGN * ALIGN for (_, hi), end in zip(regions, ends, strict=True)]
    da = (cfg.acc_bytes - acc_end) // cfg.acc_row_bytes * cfg.acc_row_bytes
    if not any(shifts) and da == 0:
        return items
    out = []
    for it in items:
        if it.kind == "instr" and it.instr.op in _ADDR_FIELDS:
            f = dict(it.instr.fields)
            for name in _ADDR_FIELDS[it.instr.op]:
                if f[name] >= ACC_BASE:
                    f[name] += da
                else:
                    f[name] += shifts[0 if f[name] < half else 1]
            it = replace(it, instr=Instr(it.instr.op, f))
        out.append(it)
    return out


def assemble(low: Lowering, order: list[int], policy: PointPolicy | None = SPILL_POINTS) -> Lowered:
    """Programs and host steps for one operator order (a topological order of the fragments), with
    cancellation points placed by `policy` (None: no points)."""
    cfg = low.cfg
    pos = {f: i for i, f in enumerate(order)}
    if sorted(order) != list(range(len(low.frags))):
        raise ValueError("the order must name every operator once")
    for f in low.frags:
        for d in f.deps:
            if pos[d] > pos[f.index]:
                raise ValueError(
                    f"operator {f.layer.node} is ordered before its input {low.frags[d].layer.node}"
                )
    out = Lowered([], low.dram, low.inputs, low.outputs, [], [], {}, low.dram_end, list(order))
    seg: list = []  # items of the NPU segment being collected
    cands: list[Candidate] = []
    spans: list[tuple[dict, int, int]] = []  # layer, first item, end item
    k_npu = 0

    def close() -> None:
        nonlocal seg, cands, spans
        if not seg:
            return
        _emit_segment(cfg, out, seg, cands, spans, policy)
        seg, cands, spans = [], [], []

    for idx in order:
        f = low.frags[idx]
        la = replace(f.layer)
        out.layers.append(la)
        if f.kind == "npu":
            items = f.placed(k_npu % 2 == 1, cfg)
            k_npu += 1
            while items and items[-1].kind == "cand":  # the boundary point follows anyway
                items = items[:-1]
            live = fragment_liveness(items, cfg)
            base = len(seg)
            for i, it in enumerate(items):
                if it.kind == "cand":
                    cands.append(Candidate(base + i, 0, False, live[i]))
            seg.extend(items)
            spans.append((la, base, len(seg)))
            cands.append(Candidate(len(seg), 0, True, []))
        elif f.kind == "host":
            close()
            out.segments.append(f.host)
            out.host_models[f.host.model] = f.host_model
    close()
    return out


def _simulated_times(cfg: NpuConfig, seg: list) -> list[int]:
    """Cycle at which each item position is reached, from the golden model's timing: the latest end
    of the instructions before it (what a point there waits for)."""
    b = ProgramBuilder(cfg)
    b._items.extend(it for it in seg if it.kind == "instr")
    built = b.build()
    m = timing_run(cfg, built.instrs, trace=True)
    end_of = {}
    for e in m.trace:
        if e.unit in ("load", "matrix", "vector", "store"):
            end_of[e.pc] = max(end_of.get(e.pc, 0), e.end)
    # pc of each instr item in order (the builder may add SYNCs between them)
    instr_pcs = [pc for pc, ins in enumerate(built.instrs) if ins.op != Opcode.SYNC and ins.op != Opcode.END]
    t_at, latest, k = [], 0, 0
    for it in seg:
        t_at.append(latest)
        if it.kind == "instr":
            latest = max(latest, end_of.get(instr_pcs[k], latest))
            k += 1
    t_at.append(latest)
    return t_at


def _emit_segment(cfg, out: Lowered, seg: list, cands: list[Candidate], spans, policy) -> None:
    # estimated time at each item position: the busiest unit's cumulative duration
    busy = [0, 0, 0, 0]
    t_at = []
    for it in seg:
        t_at.append(max(busy))
        if it.kind == "instr":
            busy[int(it.instr.unit)] += duration(it.instr, cfg)
    t_at.append(max(busy))
    if policy is not None and policy.every_instruction:
        whole = [(0, cfg.spad_bytes), (ACC_BASE, ACC_BASE + cfg.acc_bytes)]
        cands = [Candidate(i, 0, False, whole) for i, it in enumerate(seg) if it.kind == "instr" and i > 0]
        cands.append(Candidate(len(seg), 0, True, []))
    if policy is not None and policy.interval:
        t_at = _simulated_times(cfg, seg)
    for c in cands:
        c.t = t_at[c.pos]
    chosen = choose(cands, policy, cfg) if policy is not None else []
    seg_no = len(out.segments)
    out.candidates += [
        {"segment": seg_no, "est_cycles": c.t, "live_bytes": c.live_bytes, "boundary": c.boundary}
        for c in cands
    ]
    at = {c.pos: c for c in chosen}
    b = ProgramBuilder(cfg)
    new_index: dict[int, int] = {}
    point_ids: list[tuple[int, Candidate]] = []
    for i in range(len(seg) + 1):
        new_index[i] = len(b)
        if i in at:
            cp = len(out.points) + len(point_ids)
            b.cancel_point(cp)
            point_ids.append((cp, at[i]))
        if i < len(seg) and seg[i].kind != "cand":
            b._items.append(seg[i])
    built = b.build()
    start = len(out.program)
    out.program.extend(built.instrs)
    pcs = built.item_pcs + [len(built.instrs) - 1]
    for cp, c in point_ids:
        pc = start + built.cancel_points[cp]
        dump, restore = dma_cycles(c.live, cfg)
        out.points.append(
            CancelPoint(
                id=cp,
                pc=pc,
                kind="spill" if c.boundary else "interval",
                segment=seg_no,
                est_cycles=c.t,
                live_ranges=[list(r) for r in c.live],
                live_bytes=c.live_bytes,
                dump_cycles=dump,
                restore_cycles=restore,
            )
        )
    for la, i0, i1 in spans:
        p0, p1 = pcs[new_index[i0]], pcs[new_index[i1]]
        la.pc = [start + p0, start + p1]
        la.compute_cycles, la.dma_cycles, la.est_cycles = _estimate(built.instrs[p0:p1], cfg)
    out.segments.append(NpuSegment(start, len(out.program) - 1))


def lower(
    model: onnx.ModelProto, cfg: NpuConfig, source: str = "model", step: int = 0, max_live: int | None = None
) -> Lowering:
    """Lower every operator of a QDQ model (in ONNX order; `Lowering.assemble` orders them). `step`:
    split operators so that no step between cancellation point candidates exceeds it (0: no limit)."""
    return _Lowering(model, cfg, source, step, max_live or 0).run()

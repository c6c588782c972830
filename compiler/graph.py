"""The compiler's view of an ONNX graph, shared by every pass: nodes, their attributes, constant
initializers, static shapes, and who produces and consumes each tensor.

A `Graph` wraps an `onnx.ModelProto` and is rebuilt after a pass rewrites the model (the model stays
the interchange format with onnxruntime's quantiser and `onnx.reference`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import CompileError  # noqa: F401  (the passes import it from here)


def node_attrs(n: onnx.NodeProto) -> dict:
    """A node's attributes as Python values."""
    return {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}


class Graph:
    def __init__(self, model: onnx.ModelProto, source: str = "model"):
        self.model, self.source = model, source
        g = model.graph
        self.nodes: list[onnx.NodeProto] = list(g.node)
        self.consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.producers: dict[str, onnx.NodeProto] = {o: n for n in g.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.inputs: list[str] = [i.name for i in g.input if i.name not in self.consts]
        self.outputs: list[str] = [o.name for o in g.output]
        self._dims = {
            vi.name: vi.type.tensor_type.shape.dim
            for vi in list(g.input) + list(g.value_info) + list(g.output)
            if vi.type.tensor_type.HasField("shape")
        }

    def where(self, n: onnx.NodeProto) -> str:
        """How errors name a node: file, node name and operator."""
        return f"{self.source}: node {n.name or '?'} ({n.op_type})"

    def static_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor whose shape is fully known."""
        return {
            name: tuple(d.dim_value for d in dims)
            for name, dims in self._dims.items()
            if all(d.HasField("dim_value") for d in dims)
        }

    def shape(self, name: str, where: str) -> tuple[int, ...]:
        """The static shape of a tensor (constant or inferred); a dynamic or unknown shape is an error
        naming `where`."""
        if name in self.consts:
            return tuple(self.consts[name].shape)
        if name not in self._dims:
            raise CompileError(f"{where}: no shape known for tensor {name!r}")
        dims = []
        for d in self._dims[name]:
            if not d.HasField("dim_value"):
                raise CompileError(
                    f"{where}: tensor {name!r} has a dynamic dimension ({d.dim_param or '?'}); "
                    + self._dynamic_hint(name)
                )
            dims.append(d.dim_value)
        return tuple(dims)

    def _dynamic_hint(self, name: str) -> str:
        """What fixes a dynamic dimension: the input's shape, or nothing the user can give when the
        size comes from data (the front end has folded every shape computation by now)."""
        if name in self.inputs:
            return f"the NPU needs static shapes: give it with --input-shape {name}=... (input_shapes=)"
        return (
            "its size depends on values known only at run time (or on an operator shape inference "
            "does not cover); the NPU needs static shapes"
        )

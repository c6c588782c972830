"""onnx's shape inference without the weights: `onnx.shape_inference.infer_shapes` serialises the
whole model into C++ and the result back, which on a model with 100 MB of weights costs several
times the inference itself (0.26 s a call on a ResNet-50-class net, and a compile calls it about
ten times). The weights only contribute their type and shape, so inference runs on a skeleton of
the model whose large initializers are graph inputs of that type and shape; small ones and every
int32/int64 one (shape tensors, Reshape targets, Resize scales) keep their values, so inference and
its data propagation see what they would have seen (the same value_info on every zoo and real
model, tests/compiler/test_shapes.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import onnx
from onnx import TensorProto, helper, shape_inference

#: initializers with more elements than this (but int32/int64 ones) go to the skeleton as typed inputs
LARGE = 64
_SHAPE_TYPES = {TensorProto.INT64, TensorProto.INT32}


def _large(t: onnx.TensorProto) -> bool:
    return t.data_type not in _SHAPE_TYPES and math.prod(t.dims) > LARGE


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every large initializer replaced by a graph input of its type
    and shape (the rest is copied: nodes, inputs, outputs, value_info, small initializers)."""
    g = model.graph
    sk = onnx.ModelProto()
    sk.ir_version = model.ir_version
    sk.opset_import.extend(model.opset_import)
    sk.functions.extend(model.functions)
    sg = sk.graph
    sg.name = g.name
    sg.node.extend(g.node)
    sg.input.extend(g.input)
    sg.output.extend(g.output)
    sg.value_info.extend(g.value_info)
    sg.sparse_initializer.extend(g.sparse_initializer)
    declared = {i.name for i in g.input}
    for t in g.initializer:
        if not _large(t):
            sg.initializer.append(t)
        elif t.name not in declared:
            sg.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return sk


def inferred_graph(
    model: onnx.ModelProto, data_prop: bool = False, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> onnx.GraphProto:
    """The graph onnx's shape inference returns for `model` (its value_info and outputs are what
    the callers read), inferred on the skeleton; `input_shapes` replace the named graph inputs'."""
    sk = skeleton(model)
    for i in sk.graph.input:
        if input_shapes and i.name in input_shapes:
            shape = i.type.tensor_type.shape
            del shape.dim[:]
            for d in input_shapes[i.name]:
                shape.dim.add().dim_value = int(d)
    return shape_inference.infer_shapes(sk, data_prop=data_prop).graph


def infer_in_place(model: onnx.ModelProto, data_prop: bool = False, outputs: bool = True) -> onnx.ModelProto:
    """Replace `model`'s value_info (and with `outputs` its graph outputs' types) by what onnx's
    shape inference gives, as `onnx.shape_inference.infer_shapes(model, data_prop=...)` would
    return them. Returns `model`."""
    inferred = inferred_graph(model, data_prop)
    g = model.graph
    del g.value_info[:]
    g.value_info.extend(inferred.value_info)
    if outputs:
        del g.output[:]
        g.output.extend(inferred.output)
    return model


def copied(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` (CopyFrom: a twentieth of a serialise-and-parse round trip's time on a
    model of 100 MB)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def infer_shapes(model: onnx.ModelProto, data_prop: bool = False) -> onnx.ModelProto:
    """A copy of `model` with inferred shapes: `onnx.shape_inference.infer_shapes`, faster."""
    return infer_in_place(copied(model), data_prop)

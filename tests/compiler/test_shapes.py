"""compiler/shapes.py: onnx's shape inference on a skeleton of the model (its large initializers as
typed graph inputs) gives what inference on the whole model gives, data propagation included."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

from npu.compiler.shapes import LARGE, infer_shapes, skeleton
from npu.models import zoo


def _same(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    def key(m):
        return [v.SerializeToString() for v in [*m.graph.value_info, *m.graph.output]]

    return key(a) == key(b)


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
@pytest.mark.parametrize("data_prop", [False, True])
def test_the_zoo_infers_the_same_shapes(name, data_prop):
    model = zoo.ZOO[name]().model
    assert _same(shape_inference.infer_shapes(model, data_prop=data_prop), infer_shapes(model, data_prop))


def test_shape_tensors_keep_their_values_and_weights_lose_theirs():
    """A Reshape whose target is computed from an int64 initializer (data propagation) after a
    MatMul by a large float weight; the skeleton has the weight as an input, the target's value."""
    w = numpy_helper.from_array(np.ones((8, 4 * LARGE), np.float32), "w")
    tail = numpy_helper.from_array(np.array([4, LARGE], np.int64), "tail")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Shape", ["x"], ["s"], end=1),
        helper.make_node("Concat", ["s", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["y", "target"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [w, tail],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sk = skeleton(model)
    assert [t.name for t in sk.graph.initializer] == ["tail"]
    assert "w" in {i.name for i in sk.graph.input}
    ours, theirs = infer_shapes(model, True), shape_inference.infer_shapes(model, data_prop=True)
    assert _same(ours, theirs)
    z = ours.graph.output[0].type.tensor_type.shape
    assert [d.dim_value for d in z.dim] == [2, 4, LARGE]
    assert len(ours.graph.initializer) == 2  # the model itself keeps its weights

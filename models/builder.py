"""A small float ONNX graph builder for the zoo and the tests (NCHW, opset 17).

Weights come from a seeded generator (He initialisation) unless given, so every model is
reproducible from its parameters alone.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class Net:
    def __init__(self, name: str, input_shape: tuple[int, ...], seed: int = 0, input_name: str = "input"):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.shapes: dict[str, tuple[int, ...]] = {input_name: tuple(input_shape)}
        self.input = input_name
        self.count = 0

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"

    def const(self, value: np.ndarray, kind: str = "w") -> str:
        name = self._name(kind)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], shape: tuple[int, ...], **attrs) -> str:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        self.shapes[out] = tuple(shape)
        return out

    # layers -----------------------------------------------------------------------------------
    def conv(
        self,
        x: str,
        cout: int,
        k: int | tuple[int, int],
        stride: int = 1,
        pad: int | tuple[int, int, int, int] | None = None,
        groups: int = 1,
        bn: bool = False,
        relu: bool = True,
        weight: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        dilation: int = 1,
    ) -> str:
        n, cin, h, w = self.shapes[x]
        kh, kw = (k, k) if isinstance(k, int) else k
        ekh, ekw = (kh - 1) * dilation + 1, (kw - 1) * dilation + 1  # the dilated kernel's extent
        # pads (top, left, bottom, right): symmetric from an int, or given (TensorFlow's "same")
        pads = pad if isinstance(pad, tuple) else (ekh // 2, ekw // 2) * 2 if pad is None else (pad,) * 4
        if weight is None:
            fan_in = cin // groups * kh * kw
            weight = self.rng.normal(0, np.sqrt(2.0 / fan_in), (cout, cin // groups, kh, kw))
        if bias is None:
            bias = self.rng.normal(0, 0.05, cout) if not bn else np.zeros(cout)
        oh = (h + pads[0] + pads[2] - ekh) // stride + 1
        ow = (w + pads[1] + pads[3] - ekw) // stride + 1
        extra = {"dilations": [dilation, dilation]} if dilation != 1 else {}
        y = self.node(
            "Conv",
            [x, self.const(weight.astype(np.float32)), self.const(bias.astype(np.float32), "b")],
            (n, cout, oh, ow),
            kernel_shape=[kh, kw],
            strides=[stride, stride],
            pads=list(pads),
            group=groups,
            **extra,
        )
        if bn:
            y = self.batchnorm(y)
        return self.relu(y) if relu else y

    def batchnorm(self, x: str) -> str:
        """BatchNormalization over axis 1 (of a conv's or a Gemm's output) with seeded statistics."""
        c = self.shapes[x][1]
        scale = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        shift = self.rng.normal(0, 0.1, c).astype(np.float32)
        mean = self.rng.normal(0, 0.1, c).astype(np.float32)
        var = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        return self.node(
            "BatchNormalization",
            [x, self.const(scale), self.const(shift), self.const(mean), self.const(var)],
            self.shapes[x],
            epsilon=1e-5,
        )

    def relu(self, x: str) -> str:
        return self.node("Relu", [x], self.shapes[x])

    def clip(self, x: str, lo: float, hi: float) -> str:
        return self.node(
            "Clip", [x, self.const(np.float32(lo), "lo"), self.const(np.float32(hi), "hi")], self.shapes[x]
        )

    def _pool_shape(self, x: str, k: int, s: int, p: int) -> tuple[int, ...]:
        n, c, h, w = self.shapes[x]
        return (n, c, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)

    def maxpool(self, x: str, k: int, s: int, p: int = 0) -> str:
        shape = self._pool_shape(x, k, s, p)
        return self.node("MaxPool", [x], shape, kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p])

    def avgpool(self, x: str, k: int, s: int, p: int = 0, count_include_pad: int = 0) -> str:
        shape = self._pool_shape(x, k, s, p)
        return self.node(
            "AveragePool",
            [x],
            shape,
            kernel_shape=[k, k],
            strides=[s, s],
            pads=[p, p, p, p],
            count_include_pad=count_include_pad,
        )

    def gap(self, x: str) -> str:
        n, c, _, _ = self.shapes[x]
        return self.node("GlobalAveragePool", [x], (n, c, 1, 1))

    def concat(self, xs: list[str]) -> str:
        n, _, h, w = self.shapes[xs[0]]
        return self.node("Concat", xs, (n, sum(self.shapes[x][1] for x in xs), h, w), axis=1)

    def add(self, a: str, b: str) -> str:
        return self.node("Add", [a, b], self.shapes[a])

    def flatten(self, x: str) -> str:
        s = self.shapes[x]
        return self.node("Flatten", [x], (s[0], int(np.prod(s[1:]))), axis=1)

    def gemm(
        self, x: str, nout: int, weight: np.ndarray | None = None, bias: np.ndarray | None = None
    ) -> str:
        m, k = self.shapes[x]
        if weight is None:
            weight = self.rng.normal(0, np.sqrt(1.0 / k), (nout, k))
        if bias is None:
            bias = self.rng.normal(0, 0.05, nout)
        return self.node(
            "Gemm",
            [x, self.const(weight.astype(np.float32)), self.const(bias.astype(np.float32), "b")],
            (m, nout),
            transB=1,
        )

    def softmax(self, x: str) -> str:
        return self.node("Softmax", [x], self.shapes[x], axis=-1)

    def lrn(self, x: str, size: int = 5) -> str:
        return self.node("LRN", [x], self.shapes[x], size=size, alpha=1e-4, beta=0.75, bias=1.0)

    def model(self, outputs: list[str]) -> onnx.ModelProto:
        inp = helper.make_tensor_value_info(self.input, TensorProto.FLOAT, list(self.shapes[self.input]))
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(self.shapes[o])) for o in outputs]
        g = helper.make_graph(self.nodes, self.name, [inp], outs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="npu-zoo")
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m

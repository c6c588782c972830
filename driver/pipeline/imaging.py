"""Camera-like frames from real photographs and the usual image pre-processing, in numpy: the
example pipelines' loaders and the pipeline bench use them (importable by process workers)."""

from __future__ import annotations

import numpy as np

SAMPLES = ("grace_hopper.jpg", "Minduka_Present_Blue_Pack.png")


def _load_samples() -> list[np.ndarray]:
    import matplotlib.cbook as cbook
    import matplotlib.image as mimage

    out = []
    for name in SAMPLES:
        img = mimage.imread(cbook.get_sample_data(name))
        if img.dtype != np.uint8:  # PNGs come as floats in [0, 1], with alpha
            img = (np.clip(img, 0, 1) * 255).astype(np.uint8)
        out.append(np.ascontiguousarray(img[..., :3]))
    return out


def camera(size: int = 96, step: int = 7):
    """A camera-like stream: an endless pan over the sample photographs, `size` x `size` RGB uint8
    frames (HWC), the window moving `step` pixels per frame and zooming slowly."""
    images = _load_samples()
    t = 0
    while True:
        img = images[(t // 40) % len(images)]
        h, w, _ = img.shape
        win = int(min(h, w) * (0.6 + 0.3 * np.sin(t / 9.0) ** 2))
        y = (t * step) % max(1, h - win)
        x = (t * step * 2) % max(1, w - win)
        crop = img[y : y + win, x : x + win]
        yield _resize(crop, size, size).astype(np.uint8)
        t += 1


def _resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Bilinear resize of an HWC image (numpy only)."""
    ih, iw = img.shape[:2]
    ys = (np.arange(h) + 0.5) * ih / h - 0.5
    xs = (np.arange(w) + 0.5) * iw / w - 0.5
    y0 = np.clip(np.floor(ys).astype(int), 0, ih - 1)
    x0 = np.clip(np.floor(xs).astype(int), 0, iw - 1)
    y1, x1 = np.minimum(y0 + 1, ih - 1), np.minimum(x0 + 1, iw - 1)
    wy = np.clip(ys - y0, 0, 1)[:, None, None]
    wx = np.clip(xs - x0, 0, 1)[None, :, None]
    a = img.astype(np.float32)
    top = a[y0][:, x0] * (1 - wx) + a[y0][:, x1] * wx
    bot = a[y1][:, x0] * (1 - wx) + a[y1][:, x1] * wx
    return top * (1 - wy) + bot * wy


MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def preprocess(frame: np.ndarray, size: int = 64, denoise: int = 0) -> np.ndarray:
    """Resize, normalise (ImageNet mean/std) and lay out as the model's NCHW float input.
    `denoise` > 0 adds that many passes of a 3x3 box filter (CPU work a real loader would do)."""
    img = _resize(frame, size, size) / 255.0
    for _ in range(denoise):
        p = np.pad(img, ((1, 1), (1, 1), (0, 0)), mode="edge")
        img = sum(p[dy : dy + size, dx : dx + size] for dy in range(3) for dx in range(3)) / 9.0
    x = (img - MEAN) / STD
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)

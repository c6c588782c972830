"""Stage functions of the example pipelines (camera.yaml, fusion.yaml).

Frames are real photographs from matplotlib's sample data, panned and zoomed like a moving camera.
"""

from __future__ import annotations

from pathlib import Path

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


_PROJ = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32) / 4.0


def postprocess(scores: np.ndarray) -> np.ndarray:
    """The perception head's 16 scores -> the planner's 64 features (a fixed projection, squashed)."""
    return np.tanh(np.asarray(scores, np.float32).reshape(1, 16) @ _PROJ).astype(np.float32)


class ControlLog:
    """Sink: keeps every control vector in order, optionally appends them to a CSV file."""

    def __init__(self, out: str | None = None):
        self.rows: list[np.ndarray] = []
        self.path = Path(out) if out else None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")

    def __call__(self, controls: np.ndarray) -> None:
        row = np.asarray(controls, np.float32).reshape(-1)
        self.rows.append(row)
        if self.path:
            with self.path.open("a") as f:
                f.write(",".join(f"{v:.5f}" for v in row) + "\n")


def fuse(results: dict) -> dict:
    """Join of the sync queue: the detector's scores, the classifier's class and the camera frame."""
    det = np.asarray(results["detect"]).reshape(-1)
    cls = results["classify"]
    probs = np.asarray(cls[0] if isinstance(cls, list) else cls).reshape(-1)
    return {
        "det_top": int(det.argmax()),
        "det_score": round(float(det.max()), 4),
        "class": int(probs.argmax()),
        "class_p": round(float(probs.max()), 4),
        "image": results.get("frame"),
    }


def passthrough(data):
    """Hands the frame on unchanged (the camera image's branch into the sync queue)."""
    return data


class Logger:
    """Sink: one line per frame in a text file (or kept in memory)."""

    def __init__(self, out: str | None = None):
        self.lines: list[str] = []
        self.path = Path(out) if out else None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")

    def __call__(self, fused: dict) -> None:
        line = " ".join(f"{k}={v}" for k, v in fused.items() if k != "image")
        self.lines.append(line)
        if self.path:
            with self.path.open("a") as f:
                f.write(line + "\n")


class Visualiser:
    """Sink: writes every `every`-th frame as a PNG annotated with the detector's and the
    classifier's answers."""

    def __init__(self, out: str = "out/pipelines/annotated", every: int = 5):
        self.out, self.every, self.n = Path(out), every, 0
        self.out.mkdir(parents=True, exist_ok=True)
        self.written: list[Path] = []

    def __call__(self, fused: dict) -> None:
        if self.n % self.every == 0 and fused.get("image") is not None:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(3, 3))
            ax.imshow(fused["image"])
            ax.set_axis_off()
            ax.set_title(f"det {fused['det_top']} ({fused['det_score']:.2f})  "
                         f"class {fused['class']} ({fused['class_p']:.2f})", fontsize=8)  # fmt: skip
            path = self.out / f"frame{self.n:05d}.png"
            fig.savefig(path, dpi=60)
            plt.close(fig)
            self.written.append(path)
        self.n += 1

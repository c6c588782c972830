"""Stage functions of the example pipelines (camera.yaml, fusion.yaml).

Frames are real photographs from matplotlib's sample data, panned and zoomed like a moving camera.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npu.driver.pipeline.imaging import camera, preprocess  # noqa: F401 - stages of the graphs

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

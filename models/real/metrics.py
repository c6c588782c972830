"""Task metrics of the real-model test set: top-1 agreement for classifiers; for a YOLOv8 detector,
its package's post-processing (best class >= 0.25, centre/size boxes, per-class NMS at IoU 0.45)
applied to the float and the NPU outputs, and the float detections the NPU finds again (same class,
IoU >= 0.5; a YOLOX detector's raw output decoded on its grids of strides 8, 16, 32, score =
objectness x class, >= 0.1, class-agnostic NMS at 0.45, as ddddocr does); for a text detector's
probability map, the IoU of the text masks (the map above the
package's threshold 0.3)."""

from __future__ import annotations

import numpy as np


def iou(a: np.ndarray, b: np.ndarray) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return float(inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter + 1e-9))


def yolo_detections(out: np.ndarray, threshold: float = 0.25, nms: float = 0.45) -> list[tuple]:
    """(box x0 y0 x1 y1, class, score) of a (1, 4 + classes, anchors) YOLOv8 output."""
    rows = out[0].T
    scores = rows[:, 4:]
    cls, best = scores.argmax(axis=1), scores.max(axis=1)
    keep = np.flatnonzero(best >= threshold)
    found: list[tuple] = []
    for i in keep[np.argsort(-best[keep])]:
        x, y, w, h = rows[i, :4]
        box = np.array([x - w / 2, y - h / 2, x + w / 2, y + h / 2])
        if all(c != cls[i] or iou(box, b) < nms for b, c, _ in found):
            found.append((box, int(cls[i]), float(best[i])))
    return found


def matched(want: list[tuple], got: list[tuple], min_iou: float = 0.5) -> int:
    """How many of `want`'s detections `got` has (same class, IoU >= min_iou)."""
    return sum(any(c == cw and iou(b, bw) >= min_iou for b, c, _ in got) for bw, cw, _ in want)


def mask_iou(want: np.ndarray, got: np.ndarray, threshold: float = 0.3) -> float:
    """IoU of the two maps' text masks (1.0 when both are empty)."""
    a, b = want > threshold, got > threshold
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def yolox_detections(out: np.ndarray, size: int, threshold: float = 0.1, nms: float = 0.45) -> list[tuple]:
    """(box x0 y0 x1 y1, class, score) of a (1, anchors, 5 + classes) raw YOLOX output."""
    rows = out[0].astype(np.float64).copy()
    grids, strides = [], []
    for s in (8, 16, 32):
        n = size // s
        yy, xx = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        grids.append(np.stack([xx, yy], -1).reshape(-1, 2))
        strides.append(np.full((n * n, 1), s))
    grid, stride = np.concatenate(grids), np.concatenate(strides)
    xy, wh = (rows[:, :2] + grid) * stride, np.exp(rows[:, 2:4]) * stride
    scores = rows[:, 4:5] * rows[:, 5:]
    cls, best = scores.argmax(axis=1), scores.max(axis=1)
    keep = np.flatnonzero(best >= threshold)
    found: list[tuple] = []
    for i in keep[np.argsort(-best[keep])]:
        box = np.concatenate([xy[i] - wh[i] / 2, xy[i] + wh[i] / 2])
        if all(iou(box, b) < nms for b, _, _ in found):
            found.append((box, int(cls[i]), float(best[i])))
    return found

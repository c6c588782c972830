"""`python -m npu.models [-o DIR] [NAME ...]`: write the zoo's ONNX models with calibration and test
inputs (`NAME.onnx`, `NAME.calib.npy`, `NAME.test.npy`, and `NAME.labels.npy` for trained models).
By default the small models (`ZOO` and the tinyML set, each built in well under a second); the
ImageNet-class ones (up to 100 MB of weights each) only by name."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from .zoo import IMAGENET, TINYML, ZOO


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m npu.models", description=__doc__)
    p.add_argument("-o", "--out", default="models/out", help="output folder (default models/out)")
    p.add_argument(
        "names",
        nargs="*",
        help=f"models (default: all of {', '.join([*ZOO, *TINYML])}; also {', '.join(IMAGENET)})",
    )
    args = p.parse_args(argv)
    every = {**ZOO, **TINYML, **IMAGENET}
    names = args.names or [*ZOO, *TINYML]
    unknown = [n for n in names if n not in every]
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {sorted(every)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        t0 = time.perf_counter()
        z = every[name]()
        onnx.save(z.model, str(out / f"{name}.onnx"))
        np.save(out / f"{name}.calib.npy", z.calib)
        np.save(out / f"{name}.test.npy", z.test)
        if z.labels is not None:
            np.save(out / f"{name}.labels.npy", z.labels)
        print(f"{out / name}.onnx  ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Design-space exploration: which `NpuConfig` runs a set of models fastest and still fits a board.

A point is a configuration: a base preset with some parameters changed (`grid`). Its cost is the
golden model's cycles for each model, compiled for it by the real compiler (`evaluate`, one task per
point and model), and, for the candidates on the Pareto front, the core's resources from synthesis
(`synthesize`, Yosys) and optionally a board's place and route (`place_and_route`). Each task is a
pure function of its inputs; `task_key` digests them with the sources they run, so `npu dse` caches
results and spreads tasks over workers (Ray or local processes)."""

from __future__ import annotations

import functools
import hashlib
import io
import itertools
import json
import math
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npu.config import ConfigError, NpuConfig
from npu.errors import NpuError
from npu.files import tree_digest

#: the parameters a space may vary, and what each means
PARAMS: dict[str, str] = {
    "array": "the MAC array as CxPxL: clusters x PEs per cluster x lanes (C*P*L MACs/cycle); "
    "sets bus_bytes to 4P, the one bus width a P-wide array allows, unless bus_bytes is varied too",
    "spad_bytes": "scratchpad bytes (64K, 128K, ...)",
    "spad_banks": "scratchpad banks (default: the base's, raised to the least a banked array needs)",
    "acc_bytes": "accumulator bytes",
    "vector_lanes": "vector unit lanes",
    "bus_bytes": "AXI data bus bytes",
    "queue_depth": "instructions each unit queue holds",
    "engines": "engines of the SoC (a model runs on one; the others serve other models)",
    "a16_full_rate": "int16 activations at the int8 rate in the MAC array: on or off (16 x 8 "
    "multipliers and a second A read a cluster, docs/isa.md)",
}

#: parameters that are on or off
_SWITCHES = {"a16_full_rate"}


class DseError(NpuError, ValueError):
    """A design space or model list the exploration cannot take."""


def _value(name: str, text: str) -> object:
    text = text.strip()
    if name in _SWITCHES:
        if text.lower() not in ("on", "off", "1", "0", "true", "false"):
            raise DseError(f"{name}={text!r}: expected on or off")
        return text.lower() in ("on", "1", "true")
    if name == "array":
        parts = text.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise DseError(f"array={text!r}: expected CxPxL (clusters x PEs x lanes), e.g. 4x2x8")
        return tuple(int(p) for p in parts)
    scale = {"k": 1024, "m": 1024 * 1024}.get(text[-1:].lower(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit():
        raise DseError(f"{name}={text!r}: expected a whole number (K and M suffixes allowed)")
    return int(digits) * scale


def parse_param(text: str) -> tuple[str, tuple]:
    """`name=v1,v2,...` (a `--param` argument) as (name, values)."""
    name, sep, values = text.partition("=")
    name = name.strip()
    if not sep or not values.strip():
        raise DseError(f"--param {text!r}: expected NAME=V1,V2,... (names: {', '.join(PARAMS)})")
    if name not in PARAMS:
        raise DseError(
            f"--param {text!r}: unknown parameter {name!r}; the space may vary {', '.join(PARAMS)}"
        )
    return name, tuple(dict.fromkeys(_value(name, v) for v in values.split(",")))


def default_space(base: NpuConfig) -> dict[str, tuple]:
    """32 points around `base`: MAC arrays of 16 to 128 MACs/cycle (wider PEs and lanes, and more
    clusters, which only a batch fills), the scratchpad and the accumulators at the base's size and
    twice it."""
    arrays = ((1, 2, 8), (1, 4, 8), (2, 2, 8), (1, 4, 16), (1, 8, 8), (4, 2, 8), (1, 8, 16), (2, 4, 16))
    return {
        "array": arrays,
        "spad_bytes": (base.spad_bytes, 2 * base.spad_bytes),
        "acc_bytes": (base.acc_bytes, 2 * base.acc_bytes),
    }


def _label(changes: dict) -> str:
    def show(k: str, v: object) -> str:
        if k == "array":
            return "x".join(map(str, v))  # type: ignore[arg-type]
        if k.endswith("_bytes") and isinstance(v, int) and v % 1024 == 0:
            return f"{v // 1024}K"
        if isinstance(v, bool):
            return "on" if v else "off"
        return str(v)

    return " ".join(f"{k}={show(k, v)}" for k, v in changes.items())


@dataclass(frozen=True)
class Point:
    """One configuration of the space: its changes to the base, the configuration or why it is invalid."""

    label: str
    changes: dict = field(hash=False)
    config: NpuConfig | None
    error: str | None = None


def make_point(base: NpuConfig, changes: dict) -> Point:
    fields: dict = {k: v for k, v in changes.items() if k != "array"}
    if "array" in changes:
        c, p, lanes = changes["array"]
        fields.update(clusters=c, pes_per_cluster=p, lanes=lanes)
        fields.setdefault("bus_bytes", 4 * p)
    if base.spad_banked and "spad_banks" not in changes:
        c, p = fields.get("clusters", base.clusters), fields.get("pes_per_cluster", base.pes_per_cluster)
        lanes, bus = fields.get("lanes", base.lanes), fields.get("bus_bytes", base.bus_bytes)
        least = 2 * max(2, c, p, bus // lanes)
        fields["spad_banks"] = max(base.spad_banks, least)
    label = _label(changes) or "(the base)"
    name = base.name if not changes else f"{base.name}+{label.replace(' ', ',')}"
    try:
        return Point(label, dict(changes), base.replace(name=name, **fields))
    except ConfigError as e:
        return Point(label, dict(changes), None, str(e).replace(f"config {name!r}: ", ""))


def grid(base: NpuConfig, space: dict[str, tuple], sample: int | None = None, seed: int = 0) -> list[Point]:
    """Every combination of the space's values (the base first, marked by its empty changes), or a
    seeded random sample of `sample` of them (the grid is the reference; a sample explores a large
    space in the time of a small one)."""
    names = list(space)
    combos = [dict(zip(names, vals, strict=True)) for vals in itertools.product(*(space[n] for n in names))]
    if sample is not None and sample < len(combos):
        combos = random.Random(seed).sample(combos, sample)
    points = [make_point(base, {})]
    seen = {points[0].config.config_id} if points[0].config else set()
    for ch in combos:
        pt = make_point(base, ch)
        if pt.config is not None and pt.config.config_id in seen:
            continue  # the base itself, or the same hardware named twice
        if pt.config is not None:
            seen.add(pt.config.config_id)
        points.append(pt)
    return points


# -- models --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """A model to evaluate: a zoo name, or an ONNX file's bytes with its calibration inputs (.npy
    for one input, .npz by input name), sent whole to the workers (a cluster's nodes need no copy)."""

    name: str
    onnx: bytes = b""
    calib: bytes = b""

    @property
    def digest(self) -> str:
        h = hashlib.sha256(self.name.encode() + b"\0" + self.onnx + b"\0" + self.calib)
        return h.hexdigest()


def model_spec(text: str) -> ModelSpec:
    """`name` (the zoo's) or `model.onnx:calib.npy` (calibration .npy or .npz)."""
    from npu.models import zoo

    if ":" not in text and not text.endswith(".onnx"):
        known = {**zoo.ZOO, **zoo.IMAGENET}
        if text not in known:
            raise DseError(
                f"model {text!r}: not in the zoo ({', '.join(known)}) and not MODEL.onnx:CALIB.npy"
            )
        return ModelSpec(text)
    path, sep, calib = text.rpartition(":") if ":" in text else (text, "", "")
    if not sep or not calib:
        raise DseError(
            f"model {text!r}: a float ONNX file needs its calibration inputs: MODEL.onnx:CALIB.npy"
        )
    return ModelSpec(Path(path).stem, Path(path).read_bytes(), Path(calib).read_bytes())


@functools.lru_cache(maxsize=8)
def _zoo(name: str):
    """A zoo model, built once per worker process (some are trained when built)."""
    from npu.models import zoo

    return {**zoo.ZOO, **zoo.IMAGENET}[name]()


def _inputs(spec: ModelSpec, folder: Path) -> tuple[Path, object, list[np.ndarray]]:
    """The model's ONNX file (written to `folder`), calibration data and one inference's inputs."""
    import onnx

    if not spec.onnx:
        z = _zoo(spec.name)
        model, calib = z.model, z.calib
        batch = model.graph.input[0].type.tensor_type.shape.dim[0].dim_value or 1
        inputs = [z.test[:batch]]
    else:
        model = onnx.load_model_from_string(spec.onnx)
        data = np.load(io.BytesIO(spec.calib), allow_pickle=False)
        calib = dict(data) if hasattr(data, "files") else data
        names = [i.name for i in model.graph.input]
        batch = model.graph.input[0].type.tensor_type.shape.dim[0].dim_value or 1
        inputs = [calib[n][:batch] for n in names] if isinstance(calib, dict) else [calib[:batch]]
    path = folder / f"{spec.name}.onnx"
    onnx.save(model, str(path))
    return path, calib, inputs


# -- tasks ---------------------------------------------------------------------------------------


def _package(name: str) -> Path:
    import importlib

    return Path(importlib.import_module(name).__file__).parent


@functools.cache  # every task's key names it: the sources are read once per process
def sources_digest(kind: str) -> str:
    """The sources an `evaluate` ("eval") or `synthesize`/`place_and_route` ("hw") result depends on
    (this module's own among them)."""
    contracts = [*sorted(_package("npu").glob("*.py")), Path(__file__)]
    if kind == "eval":
        return tree_digest(
            [*contracts, *(_package(p) for p in ("npu.compiler", "npu.sim.golden", "npu.models"))]
        )
    return tree_digest([*contracts, _package("npu.hdl")])


def task_key(kind: str, config: NpuConfig, *parts: str) -> str:
    text = json.dumps([kind, config.hardware_dict(), list(parts), sources_digest(kind.split(":")[0])])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class EvalTask:
    config: NpuConfig
    model: ModelSpec
    activations: str = "auto"

    def key(self) -> str:
        return task_key("eval", self.config, self.model.digest, self.activations)


def evaluate(task: EvalTask) -> dict:
    """The model compiled for the configuration and run once on the golden model: its cycles, the
    NPU's MACs and the array's utilisation, or why it does not compile (`error`)."""
    from npu.compiler import compile_onnx
    from npu.sim.golden.runner import run_container

    cfg, t0 = task.config, time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path, calib, inputs = _inputs(task.model, Path(tmp))
        try:
            cm = compile_onnx(path, cfg, calib=calib, activations=task.activations)
        except NpuError as e:  # the model does not fit this configuration: a result, not a failure
            return {"model": task.model.name, "error": str(e).replace(str(path), task.model.name)}
        compile_s, t1 = time.perf_counter() - t0, time.perf_counter()
        _, counters = run_container(cm.to_container(), inputs, cm.cfg)
    cycles, macs = counters["CYCLES"], cm.placement.macs_npu
    return {
        "model": task.model.name,
        "cycles": cycles,
        "macs": macs,
        "utilization": round(macs / (cycles * cfg.macs_per_cycle), 4) if cycles else 0.0,
        "latency_us": round(cycles / cfg.clock_mhz, 3),
        "compile_s": round(compile_s, 2),
        "run_s": round(time.perf_counter() - t1, 2),
    }


@dataclass(frozen=True)
class SynthTask:
    config: NpuConfig

    def key(self) -> str:
        return task_key("hw:synth", self.config)


def synthesize(task: SynthTask) -> dict:
    """The core's ECP5 resources from Yosys (npu.hdl.boards.units.core_resources)."""
    from npu.hdl.boards.units import core_resources

    with tempfile.TemporaryDirectory() as tmp:
        return core_resources(task.config, Path(tmp))


@dataclass(frozen=True)
class PnrTask:
    board: str
    config: NpuConfig
    clock_mhz: float
    folder: str

    def key(self) -> str:
        return task_key("hw:pnr", self.config, self.board, str(self.clock_mhz))


def place_and_route(task: PnrTask) -> dict:
    """The whole board built for the configuration (npu.hdl.boards.build; seed 1): Fmax and resources."""
    from npu.hdl.boards.boards import get_board
    from npu.hdl.boards.build import build

    r = build(get_board(task.board), task.config, task.clock_mhz, Path(task.folder))
    fmax = min((f["achieved_mhz"] for f in r["fmax"].values()), default=0.0)
    return {
        "achieved_mhz": fmax,
        "timing_met": r["timing_met"],
        "resources": r["resources"],
        "build_seconds": r["build_seconds"],
        "bitstream": r["bitstream"],
    }


# -- the front -----------------------------------------------------------------------------------


def summarize(point: Point, evals: dict[str, dict], models: list[str]) -> dict:
    """One point's row: its configuration and per-model results; `latency_us` is the geometric mean
    of the models' latencies (None when a model does not compile for it or was not run)."""
    cfg = point.config
    row: dict = {
        "label": point.label,
        "changes": {k: list(v) if isinstance(v, tuple) else v for k, v in point.changes.items()},
    }
    if cfg is None:
        return {**row, "valid": False, "error": point.error, "latency_us": None}
    row.update(
        valid=True,
        config=cfg.name,
        config_id=f"{cfg.config_id:#010x}",
        macs_per_cycle=cfg.macs_per_cycle,
        onchip_bytes=cfg.spad_bytes + cfg.acc_bytes,
        describe=cfg.describe(),
    )
    res = [evals.get(m) for m in models]
    row["models"] = {m: r for m, r in zip(models, res, strict=True) if r is not None}
    ok = [r for r in res if r is not None and "cycles" in r]
    if len(ok) < len(models):
        row["latency_us"] = None
        row["error"] = (
            "; ".join(f"{r['model']}: {r['error']}" for r in res if r is not None and "error" in r) or None
        )
        return row
    row["latency_us"] = round(math.exp(sum(math.log(r["latency_us"]) for r in ok) / len(ok)), 3)
    row["utilization"] = round(sum(r["utilization"] for r in ok) / len(ok), 4)
    return row


def pareto(rows: list[dict], keys: tuple[str, ...]) -> list[int]:
    """Indices of the rows no other row beats or equals in every key (all minimised), by the first key."""
    cand = [i for i, r in enumerate(rows) if all(r.get(k) is not None for k in keys)]

    def dominates(a: dict, b: dict) -> bool:
        return all(a[k] <= b[k] for k in keys) and any(a[k] < b[k] for k in keys)

    front = [i for i in cand if not any(dominates(rows[j], rows[i]) for j in cand if j != i)]
    return sorted(front, key=lambda i: tuple(rows[i][k] for k in keys))


def fits(resources: dict, capacity: dict[str, int]) -> bool:
    return all(resources.get(k, 0) <= cap for k, cap in capacity.items())

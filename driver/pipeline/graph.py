"""The pipeline description file (YAML or JSON): the device, the models, the stages by import path
with their worker counts, and the queues with their kinds and sizes. See docs/pipelines.md.

    npu: {config: default}
    models:
      perception: {zoo: perception, cp_interval: 20000}
      planning: {path: planning.npub}
    stages:
      camera: {source: "stages:camera", frames: 50}
      prep:   {fn: "stages:preprocess", workers: 2, processes: true}
      detect: {model: perception, priority: low}
      sink:   {fn: "stages:Sink"}
    queues:
      raw:    {kind: basic, size: 8, from: camera, to: prep}
      ...
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from ..runtime import Npu, Priority
from .frames import PipelineError
from .pipeline import Pipeline

STAGE_KEYS = {
    "source",
    "fn",
    "model",
    "workers",
    "processes",
    "ordered",
    "args",
    "frames",
    "stream",
    "priority",
    "int8",
}
QUEUE_KEYS = {"kind", "size", "from", "to"}
MODEL_KEYS = {"zoo", "path", "instances", "cp_interval", "granularity"}
NPU_KEYS = {"backend", "config", "engines", "dispatch", "port", "baud"}  # port, baud: serial
TOP_KEYS = {"name", "npu", "models", "stages", "queues"}


def read_description(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise PipelineError(f"{path}: cannot read the pipeline description: {e.strerror}") from None
    try:
        if path.suffix.lower() == ".json":
            desc = json.loads(text)
        else:
            import yaml

            desc = yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001 - yaml and json raise different types
        raise PipelineError(
            f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}"
        ) from None
    if not isinstance(desc, dict):
        raise PipelineError(f"{path}: the description must be a mapping with 'stages' and 'queues'")
    return desc


def _names(v: Any, where: str) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
        return list(v)
    raise PipelineError(f"{where}: expected a stage name or a list of them, got {v!r}")


def _keys(spec: Any, allowed: set[str], where: str) -> dict:
    if not isinstance(spec, dict):
        raise PipelineError(f"{where}: expected a mapping, got {spec!r}")
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise PipelineError(
            f"{where}: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})"
        )
    return spec


def _flag(spec: dict, key: str, where: str) -> bool:
    """A yes/no field: true or false only ("no" or 1 are refused rather than read as true)."""
    v = spec.get(key, False)
    if not isinstance(v, bool):
        raise PipelineError(f"{where}.{key}: expected true or false, got {v!r}")
    return v


def _check_trusted(ref: Any, base: Path, where: str) -> None:
    """A graph file names code to run, so by default it may name only the project's own functions
    (`npu.*`) and modules in its own folder; anything else (`os:system`) needs `trust=True`."""
    if not isinstance(ref, str):
        return  # resolve() reports the type
    top = ref.partition(":")[0].split(".")[0]
    if top == "npu":
        return
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return  # resolve() reports the missing module by name
    origin = spec.origin if spec.origin not in (None, "built-in", "frozen") else None
    locs = [origin] if origin else list(spec.submodule_search_locations or [])
    if locs and all(Path(loc).resolve().is_relative_to(base) for loc in locs):
        return
    raise PipelineError(
        f"{where}: {ref!r} is outside npu.* and the graph's folder {base}; a graph file is code, "
        "so run it with --trust (load_graph(..., trust=True)) only if you trust its author"
    )


def _priority(v: Any, where: str) -> int:
    try:
        return Priority.of(v, names=True)
    except ValueError as e:
        raise PipelineError(f"{where}: {e}") from None


def _load_model(npu: Npu, name: str, spec: dict, base: Path):
    where = f"models.{name}"
    _keys(spec, MODEL_KEYS, where)
    if ("zoo" in spec) == ("path" in spec):
        raise PipelineError(
            f"{where}: give exactly one of 'zoo' (a zoo model name) or 'path' (an .npub file)"
        )
    if "zoo" in spec:
        from npu.models.zoo import ZOO

        from ..demo import compile_zoo

        if spec["zoo"] not in ZOO:
            raise PipelineError(
                f"{where}: unknown zoo model {spec['zoo']!r} (one of {', '.join(sorted(ZOO))})"
            )
        opts = {k: spec[k] for k in ("cp_interval", "granularity") if k in spec}
        container, _ = compile_zoo(spec["zoo"], npu.cfg.engine.name, **opts)
    else:
        container = base / spec["path"]
        if not container.exists():
            raise PipelineError(f"{where}: no such file {container}")
    return npu.load(container, name, instances=spec.get("instances", 1))


def load_graph(
    path: str | Path,
    *,
    npu: Npu | None = None,
    backend: str | None = None,
    frames: int | None = None,
    port: str | None = None,
    trust: bool = False,
) -> Pipeline:
    """Build (and validate) the pipeline a description file gives. `npu` replaces the description's
    device; `backend` its backend (model, serial); `port` the serial port; `frames` the frame count
    of every source. Stage functions must come from `npu.*` or the file's own folder unless
    `trust` (a graph file runs code: trust it as you would a script)."""
    path = Path(path)
    desc = read_description(path)
    _keys(desc, TOP_KEYS, str(path))
    base = path.parent.resolve()
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))  # stage modules live next to the description
    stages = desc.get("stages")
    if not isinstance(stages, dict) or not stages:
        raise PipelineError(f"{path}: 'stages' must be a mapping of stage names to their specs")
    models = desc.get("models") or {}
    if not isinstance(models, dict):
        raise PipelineError(f"{path}: 'models' must be a mapping of model names to their specs")
    uses_npu = any(isinstance(s, dict) and "model" in s for s in stages.values())
    if npu is None and uses_npu:
        opts = dict(_keys(desc.get("npu") or {}, NPU_KEYS, f"{path}: npu"))
        if backend is not None:
            opts["backend"] = backend
        if port is not None:
            opts["port"] = port
        npu = Npu(opts.pop("backend", "model"), opts.pop("config", "default"), **opts)
    p = Pipeline(npu, name=desc.get("name", path.stem), paths=[str(base)])
    loaded = {}
    for name, spec in stages.items():
        where = f"{path}: stages.{name}"
        spec = _keys(spec, STAGE_KEYS, where)
        kinds = [k for k in ("source", "fn", "model") if k in spec]
        if len(kinds) != 1:
            raise PipelineError(f"{where}: give exactly one of 'source', 'fn' or 'model'")
        args = spec.get("args") or {}
        if not isinstance(args, dict):
            raise PipelineError(f"{where}: 'args' must be a mapping")
        if kinds[0] in ("source", "fn") and not trust:
            _check_trusted(spec[kinds[0]], base, where)
        if kinds[0] == "source":
            n = frames if frames is not None else spec.get("frames")
            p.source(name, spec["source"], frames=n, stream=spec.get("stream"), args=args)
        elif kinds[0] == "fn":
            p.stage(
                name,
                spec["fn"],
                workers=spec.get("workers", 1),
                processes=_flag(spec, "processes", where),
                ordered=_flag(spec, "ordered", where),
                args=args,
            )
        else:
            m = spec["model"]
            if m not in models:
                raise PipelineError(
                    f"{where}: unknown model {m!r} (models: {', '.join(sorted(models)) or 'none'})"
                )
            if m not in loaded:
                loaded[m] = _load_model(npu, m, models[m], base)
            p.runner(
                name,
                loaded[m],
                priority=_priority(spec.get("priority", "normal"), where),
                workers=spec.get("workers", 1),
                int8=_flag(spec, "int8", where),
                ordered=_flag(spec, "ordered", where),
            )
    queues = desc.get("queues") or {}
    if not isinstance(queues, dict):
        raise PipelineError(f"{path}: 'queues' must be a mapping of queue names to their specs")
    for name, spec in queues.items():
        where = f"{path}: queues.{name}"
        spec = _keys(spec, QUEUE_KEYS, where)
        for k in ("from", "to"):
            if k not in spec:
                raise PipelineError(f"{where}: missing '{k}'")
        try:
            p.queue(
                name,
                spec.get("kind", "basic"),
                spec.get("size", 8),
                producers=_names(spec["from"], f"{where}.from"),
                consumers=_names(spec["to"], f"{where}.to"),
            )
        except PipelineError as e:
            raise PipelineError(f"{path}: {e}") from None
    try:
        p.validate()
    except PipelineError as e:
        raise PipelineError(f"{path}: {e}") from None
    return p

"""`compile_onnx`: ONNX file -> NPU programs, host steps and everything needed to run them."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from npu.arith import round_up
from npu.config import NpuConfig, get_config
from npu.container import Container, DramImage, Manifest, NpuSegment, ProgramInfo
from npu.isa import encode_program

from . import accuracy, parallel, precision, region
from .accuracy import Accuracy
from .assemble import Lowered, Reuse, assemble
from .cleanup import cleanup
from .dram import DramPlan
from .errors import AccuracyError, DramTooSmall
from .frontend import Prepared
from .graph import CompileError
from .load import is_qdq, load
from .lower import VIRTUAL_DRAM, DramFull, Lowering, lower
from .ops.registry import is_fused
from .options import CompileOptions
from .order import SearchResult, search_order, whole_program
from .outputs import clamped_by_quantisation, keep_output_precision
from .placement import Placement, layer_macs, matrix_steps, placement
from .points import PointPolicy
from .progress import reporting, stage
from .quantize import (
    calibrated_ranges_of,
    calibration_batches,
    check_calibration,
    clipped_tensors,
    is_kept,
    per_channel_choice,
    quantisation_key,
    quantize_float_model,
    remember,
    with_headroom,
)
from .region import Regions
from .rounding import correct_biases, round_weights, weight_errors
from .shapes import copied
from .wide_weights import choose_wide, split_weights

#: compiles of the int16-weights repair with the layers chosen (each adding those its own weights
#: check finds still losing) before it takes int16 weights in every layer
WIDE_ROUNDS = 3


@dataclass
class CompiledModel:
    cfg: NpuConfig
    lowered: Lowered
    program_base: int
    # the quantised model (onnxruntime's reference for the int8 results); a channels-last input
    # folded into the NPU's layout (CompiledModel.frontend) is NCHW here
    qdq: onnx.ModelProto
    source: str = ""
    compile_s: float = 0.0
    search: SearchResult | None = None
    granularity: str = "segment"
    frontend: list[str] = field(default_factory=list)  # what the front end did (opset, pads, layouts)
    regions: Regions | None = None  # the on-chip regions the program keeps to (None: whole memories)
    quantisation: str = "the model's own (QDQ)"  # how a float model was quantised (report)
    points_note: str = ""  # why the cancellation points differ from what the options asked (report)
    fit_note: str = ""  # why int16 depthwise convolutions run one MATMUL a chunk (report)
    accuracy: Accuracy | None = None  # the accuracy guard's check (None: not run)

    @property
    def program(self) -> bytes:
        return encode_program(self.lowered.program)

    @property
    def placement(self) -> Placement:
        """Operators and MACs of the quantised graph on the NPU and on the host."""
        return placement(self.qdq, self.lowered.layers)

    @property
    def dram_plan(self) -> DramPlan:
        """The DRAM plan: arena peak, lower bound, bump total (compiler/dram.py)."""
        return self.lowered.dram_plan

    @property
    def manifest(self) -> Manifest:
        low = self.lowered
        return Manifest(
            config=self.cfg.name,
            program=ProgramInfo(self.program_base, len(low.program)),
            dram=[DramImage(addr, f"dram{i}") for i, (addr, _) in enumerate(low.dram)],
            inputs=low.inputs,
            outputs=low.outputs,
            segments=low.segments,
            layers=low.layers,
            cancel_points=low.points,
            granularity=self.granularity,  # type: ignore[arg-type]
            spad_region=[r.spad_start, r.spad_size] if (r := self.regions) else None,
            acc_region=[r.acc_start, r.acc_size] if r else None,
        )

    def to_container(self) -> Container:
        blobs = {"program": self.program, **self.lowered.host_models}
        for i, (_, data) in enumerate(self.lowered.dram):
            blobs[f"dram{i}"] = data
        return Container(self.cfg.config_id, self.manifest, blobs)

    def run(self, *inputs: np.ndarray, model=None, timed: bool = False) -> list[np.ndarray]:
        """Run on the golden model; float (dequantised) outputs. The values are computed in program
        order (`InOrderDevice`: the timed model's values, in about half its time); `timed` (or a
        `model` of the caller's) runs the event-timed model."""
        from npu.sim.golden.runner import run_container

        in_order = model is None and not timed
        return run_container(self._container(), list(inputs), self.cfg, model=model, in_order=in_order)[0]

    def run_int8(self, *inputs: np.ndarray, model=None) -> list[np.ndarray]:
        """Run on the golden model; int8 outputs (host-computed float outputs stay float)."""
        from npu.sim.golden.runner import run_container

        return run_container(self._container(), list(inputs), self.cfg, model=model, int8=True)[0]

    def _container(self) -> Container:
        """`to_container`, built once for the runs (encoding a large program takes a fifth of a
        run); built again if a field it depends on was replaced since."""
        low = self.lowered
        key = (id(low), id(low.program), len(low.program), id(low.dram), self.program_base, self.granularity,
               self.regions)  # fmt: skip
        if getattr(self, "_runs", (None,))[0] != key:
            self._runs = (key, self.to_container())
        return self._runs[1]

    def _order_report(self) -> list[str]:
        if self.search is None:
            return ["operator order: ONNX order (--order default)"]
        r = self.search
        lines = [
            f"operator order: searched for {r.objective} in {r.search_s:.2f} s over {len(r.subgraphs)} "
            f"subgraphs (cut at key nodes, large ones into runs), predicted gain {r.predicted_gain} cycles"
            + (" (time budget reached: later subgraphs keep the ONNX order)" if r.timed_out else "")
        ]
        if r.whole is not None:
            lines.append(
                f"  whole program: {r.whole[0]:,} cycles in the searched order, {r.whole[1]:,} in the ONNX "
                f"order: {'ONNX order kept' if r.kept_onnx else 'searched order taken'}"
            )
        for i, s in enumerate(r.subgraphs):
            names = [self.lowered.layers[self.lowered.order.index(v)].node for v in s.order]
            lines.append(
                f"  subgraph {i}: {len(s.order)} operators, {s.orders}"
                f"{'+' if s.method.startswith('sampled') else ''} orders, {s.method}, "
                + (
                    f"{s.evaluated} evaluated, {s.default_cycles} -> {s.best_cycles} cycles"
                    if s.method != "single"
                    else "not timed"
                )
                + f", peak live {s.default_peak} -> "
                f"{s.best_peak} bytes: "
                + " ".join(str(n) for n in names[:12])
                + (" ..." if len(names) > 12 else "")
            )
        return lines

    @property
    def cp_cycles_added(self) -> int | None:
        """The cycles the cancellation points add: the NPU segments' golden-model cycles with them
        less without them (the same builds; a point waits for the units to drain). None where the
        points were placed on estimates (no interval), so the build without them was not timed."""
        if not self.lowered.points:
            return 0
        if self.lowered.cycles_without_points is None:
            return None
        return self._npu_cycles() - self.lowered.cycles_without_points

    def _npu_cycles(self) -> int:
        """The NPU segments' golden-model cycles (the cost model's), points included."""
        return self.lowered.npu_cycles

    @property
    def max_cp_gap(self) -> int:
        """The longest an urgent model waits for this one, estimated: the most cycles from the
        first start of anything after a cancellation point (a pause asked then targets the next
        one; a segment's start) to the next point's reach, where every unit has parked."""
        gap, last = 0, {}
        for p in self.lowered.points:
            gap = max(gap, p.est_cycles - last.get(p.segment, 0))
            last[p.segment] = p.est_cycles if p.est_first_start is None else p.est_first_start
        return gap

    def _points_cost(self) -> str:
        added = self.cp_cycles_added
        if added is None:
            return ""
        total = self._npu_cycles()
        share = added / (total - added) if total > added else 0.0
        return f"; they add {added:,} cycles ({share:.1%}) to the program without them (golden model)"

    def _points_report(self) -> list[str]:
        pts = self.lowered.points
        if not pts:
            return ["cancellation points: none"]
        spill = sum(p.kind == "spill" for p in pts)
        lines = [
            f"cancellation points: {len(pts)} ({spill} spill points at operator boundaries, "
            f"{len(pts) - spill} interval points), largest estimated gap {self.max_cp_gap} cycles "
            f"({self.max_cp_gap / self.cfg.clock_mhz:,.1f} us at {self.cfg.clock_mhz:g} MHz), "
            f"largest live data {max(p.live_bytes for p in pts)} bytes"
            + (f" ({self.points_note})" if self.points_note else "")
            + self._points_cost(),
            f"  {'id':>4} {'pc':>6} {'kind':<8} {'est cycle':>10} {'live bytes':>10} {'dump':>6} "
            f"{'restore':>7}  ranges",
        ]
        shown = pts if len(pts) <= 60 else pts[:30] + pts[-30:]
        for k, p in enumerate(shown):
            if len(pts) > 60 and k == 30:
                lines.append(f"  ... {len(pts) - 60} more ...")
            rng = " ".join(f"[0x{s:x},0x{e:x})" for s, e in p.live_ranges[:3])
            lines.append(
                f"  {p.id:>4} {p.pc:>6} {p.kind:<8} {p.est_cycles:>10} {p.live_bytes:>10} "
                f"{p.dump_cycles:>6} {p.restore_cycles:>7}  {rng}"
            )
        return lines

    def _segments_report(self) -> list[str]:
        """Totals of the per-segment figures a layer-wise scheduler reads (NpuSegment)."""
        segs = [s for s in self.lowered.segments if isinstance(s, NpuSegment)]
        if not segs:
            return []
        most = lambda k: max(getattr(s, k) or 0 for s in segs)  # noqa: E731
        total = lambda k: sum(getattr(s, k) or 0 for s in segs)  # noqa: E731
        return [
            f"NPU segments: largest on-chip footprint {most('spad_bytes')} scratchpad + "
            f"{most('acc_bytes')} accumulator bytes; DMA {total('dma_rd_bytes')} bytes read, "
            f"{total('dma_wr_bytes')} written; {total('dma_cycles')} DMA and {total('compute_cycles')} "
            "compute cycles (cost model)"
        ]

    def report(self) -> str:
        """Placement, splits, cancellation points, predicted cycles and scratchpad peak."""
        low = self.lowered
        lines = [
            f"{'#':>3}  {'node':<28} {'op':<18} {'where':<5} {'est cycles':>10} {'util':>5}  split / reason"
        ]
        total = 0
        peak = 0
        macs = layer_macs(self.qdq)  # util: MACs over (predicted cycles x the array's MACs a cycle)
        for i, la in enumerate(low.layers):
            est = (la.est_cycles or 0) if la.placement == "npu" else 0
            total += est
            peak = max(peak, la.spad_bytes or 0)
            note = (la.split or "") if la.placement != "host" else (la.reason or "")
            m = macs.get(str(la.node), 0)
            util = f"{m / (est * self.cfg.macs_per_cycle):.2f}" if m and est else ""
            lines.append(
                f"{i:>3}  {str(la.node)[:28]:<28} {la.op:<18} {la.placement:<5} {est:>10} {util:>5}  {note}"
            )

        n_npu = sum(la.placement == "npu" for la in low.layers)
        n_fused = sum(map(is_fused, low.layers))
        n_views = sum(la.placement == "view" for la in low.layers) - n_fused
        n_host = sum(la.placement == "host" for la in low.layers)
        steps = sum(s.kind == "host" for s in low.segments)
        host = "nothing"
        if n_host:
            macs = self.placement.macs_host
            host = f"{n_host} operators in {steps} steps, {macs:,} MACs (numpy, not predicted)"
        lines += [
            "",
            *(f"front end: {note}" for note in self.frontend),
            *([f"depthwise convolutions of int16 input: {self.fit_note}"] if self.fit_note else []),
            f"operators: {n_npu} on the NPU, {n_host} on the host, {n_views} views (no data moved)"
            + (f", {n_fused} computed in their producer's output pass" if n_fused else ""),
            self.placement.describe() + " (ONNX operators of the quantised graph; steps of a table "
            "function count as NPU work)",
            f"segments: {len(low.segments)} (" + ", ".join(s.kind for s in low.segments) + ")",
            *self._order_report(),
            *self._points_report(),
            f"quantisation: {self.quantisation}",
            f"accuracy: {self.accuracy.describe() if self.accuracy else 'not checked'}",
            f"predicted cycles: {total} on the NPU (cost model); host: {host}",
            *([f"on-chip: {self.regions.describe()}"] if self.regions else []),
            f"scratchpad peak: {peak} of "
            f"{self.regions.spad_size if self.regions else self.cfg.spad_bytes} bytes",
            *self._segments_report(),
            *([low.dram_plan.describe()] if low.dram_plan else []),
            f"instructions: {len(low.program)}, DRAM used: {low.dram_end} bytes (program at "
            f"0x{self.program_base:x}, {len(low.program) * 32} bytes)",
            f"compile time: {self.compile_s:.2f} s",
        ]
        return "\n".join(lines)


def compile_onnx(
    path: str | Path,
    config: str | NpuConfig = "default",
    calib: np.ndarray | Mapping[str, np.ndarray] | None = None,
    options: CompileOptions | None = None,
    progress: Callable[[str], None] | None = None,
    **changes,
) -> CompiledModel:
    """Compile an ONNX model (a float model with calibration inputs `calib`: an array for its one
    input, or one array per input name; or a QDQ model) for `config`, with `options` (default
    CompileOptions(); keyword arguments change single options, e.g. `activations="int8"`: see
    CompileOptions for each option's choices and meaning). `progress` is called with a line as each
    stage starts (loading, quantising, lowering, order search, assembly, the accuracy check).

    This is the driver around one pass pipeline (`_compile`): the model is loaded once; with
    `activations="auto"` a float model compiles with an int8/int16 mix (compiler/precision.py),
    with int16 everywhere when the mix fails the accuracy check, and with int8 when int16 does not
    fit the configuration (the report says why)."""
    opts = (options or CompileOptions()).replace(**changes)
    t0 = time.perf_counter()
    cfg = get_config(config).engine  # a model runs on one engine (of a SoC preset: its engine)
    with reporting(progress), _fewer_collections():
        stage(f"loading {path}")
        prepared = load(path, opts.input_shapes)
        if is_qdq(prepared.model):  # a QDQ model keeps its own types and weights
            compiled = _compile_fitting(prepared, cfg, calib, opts, path)
        elif opts.activations != "auto":
            try:
                compiled = _compile_fitting(prepared, cfg, calib, opts, path)
            except AccuracyError as e:
                if getattr(e, "weights_lose", None) is None:
                    raise
                compiled = _with_wide_weights(prepared, cfg, calib, opts, path, e)
        else:
            compiled = _compile_auto(prepared, cfg, calib, opts, path)
        stage("done")
    compiled.compile_s = time.perf_counter() - t0
    return compiled


_gc_lock = threading.Lock()
_gc_users = 0
_gc_saved: tuple[int, ...] = ()


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """The passes make millions of small objects (instructions, spans, items) that live until the
    compile ends, and the garbage collector's passes over them took 15 % of a ResNet-50-class
    compile (docs/compiler.md): its thresholds are raised while any compile runs (the peak memory
    did not change: the compiler makes few reference cycles), then restored."""
    global _gc_users, _gc_saved
    with _gc_lock:
        if _gc_users == 0:
            _gc_saved = gc.get_threshold()
            gc.set_threshold(200_000, 100, 1000)
        _gc_users += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_users -= 1
            if _gc_users == 0:
                gc.set_threshold(*_gc_saved)


class _MixRefused(AccuracyError):
    """The accuracy check refused an int8/int16 mix (auto then takes int16 everywhere)."""


def _first(e: Exception) -> str:
    """An AccuracyError's first clause without the file name: the output and its cosine."""
    return str(e).split(";")[0].split(": ", 1)[-1]


def _compile_auto(prepared: Prepared, cfg: NpuConfig, calib, opts: CompileOptions, path) -> CompiledModel:
    """`activations="auto"` for a float model (compile_onnx)."""
    int16 = opts.replace(activations="int16")
    try:
        compiled = _compile_fitting(prepared, cfg, calib, opts.replace(activations="mixed"), path, auto=True)
        compiled.quantisation += " (auto)"
        return compiled
    except AccuracyError as e:
        if getattr(e, "weights_lose", None) is not None:  # int16 activations alone cannot reach the target
            return _with_wide_weights(prepared, cfg, calib, int16, path, e)
        if not isinstance(e, _MixRefused):
            raise  # int16 everywhere was refused: int8 would be less accurate still
        why = f"the int8/int16 mix failed the accuracy check: {e}"
    except CompileError as e:
        why = f"the int8/int16 mix did not compile: {e}"
    stage(f"{why}; again with int16 activations")
    try:
        compiled = _compile_fitting(prepared, cfg, calib, int16, path)
        compiled.quantisation += f" (auto: {why})"
    except AccuracyError as e:
        if getattr(e, "weights_lose", None) is None:
            raise
        compiled = _with_wide_weights(prepared, cfg, calib, int16, path, e)
    except CompileError as e:
        stage(f"int16 activations did not compile ({e}); again with int8")
        compiled = _compile_fitting(prepared, cfg, calib, opts.replace(activations="int8"), path)
        compiled.quantisation += f" (auto: int16 activations did not compile: {e})"
    return compiled


def _with_wide_weights(
    prepared: Prepared, cfg: NpuConfig, calib, opts: CompileOptions, path, refused: AccuracyError
) -> CompiledModel:
    """The repair after `refused`, whose int8 weights alone stay below the target (its
    `weights_lose`): int16 weights (compiler/wide_weights.py) in the layers whose int8 weights lose
    the most (its `wide`), with more where that model's weights check finds its int8 rest still
    losing too much (up to WIDE_ROUNDS compiles), then in every layer; if none reaches the target,
    the last refusal (which names the operators and where the loss is), with `refused`'s figure."""
    why = _first(refused)
    wide = opts.replace(weight_precision="int16")
    layers = tuple(getattr(refused, "wide", ()))
    for _ in range(WIDE_ROUNDS if layers else 0):
        stage(f"{why}: again with int16 weights in the {len(layers)} layers whose int8 weights lose the most")
        try:
            some = wide.replace(wide_layers=layers)
            compiled = _compile_fitting(prepared, cfg, calib, some, path, auto=True)
            compiled.quantisation += (
                f" (auto: {why}; int16 weights where int8 ones lose the most: {', '.join(layers)})"
            )
            return compiled
        except AccuracyError as e:
            why += f"; with int16 weights in {len(layers)} layers {_first(e)}"
            more = tuple(n for n in getattr(e, "wide", ()) if n not in layers)
            if not more:
                break
            layers += more  # the split model's own weights check chose these beside them
    stage(f"{why}: again with int16 weights in every layer")
    try:
        compiled = _compile_fitting(prepared, cfg, calib, wide, path)
    except AccuracyError as e:
        # the last compile's refusal names the operators and where the loss is
        raise AccuracyError(f"{e} (That with int16 weights; before them, {_first(refused)}.)") from None
    compiled.quantisation += f" (auto: {why})"
    return compiled


def _compile_fitting(
    prepared: Prepared, cfg: NpuConfig, calib, opts: CompileOptions, path, auto: bool = False
) -> CompiledModel:
    """`_compile`; when the program does not fit the DRAM, again with the smaller programs: int16
    depthwise chunks as one MATMUL each (not one an A word), then points at operator boundaries only
    (where the default pause budget, not an interval asked for, cut operators into more steps), then
    both. The report says what was given up; the first error stands if none fits."""
    tries = [opts]
    if opts.narrow_depthwise:
        tries.append(opts.replace(narrow_depthwise=False))
    if not opts.cp_interval and opts.interval(cfg):
        tries += [t.replace(max_pause_us=0) for t in tries]
    first = None
    for t in tries:
        try:
            compiled = _compile(_fresh(prepared), cfg, calib, t, path, auto)
        except DramTooSmall as e:
            first = first or e
            continue
        if t is opts:
            return compiled
        if t.max_pause_us != opts.max_pause_us:
            compiled.points_note = (
                f"only at operator boundaries: with points at most {opts.max_pause_us:g} us apart "
                f"(--max-pause-us) the model did not fit: {first}"
            )
        if t.narrow_depthwise != opts.narrow_depthwise:
            compiled.fit_note = (
                f"one MATMUL a chunk (--no-narrow-depthwise): the program did not fit: {first}"
            )
        return compiled
    raise first


def _fresh(prepared: Prepared) -> Prepared:
    """A copy the passes may change (the fallback compiles the loaded model again)."""
    model = copied(prepared.model)
    return dataclasses.replace(prepared, model=model, notes=list(prepared.notes))


def _nchw_calibration(prepared: Prepared, calib, path: str | Path):
    """The calibration data as the float model's inputs take them: a channels-last input's (whose
    transpose the front end folded) transposed back to NCHW."""
    for name, shape in prepared.nhwc_inputs.items():  # calibration comes as the input: NHWC
        if isinstance(calib, Mapping):
            if name in calib:
                nhwc = check_calibration(calib[name], name, list(shape), str(path))
                calib = {**calib, name: nhwc.transpose(0, 3, 1, 2)}
        else:
            calib = check_calibration(calib, name, list(shape), str(path)).transpose(0, 3, 1, 2)
    return calib


def _quantize(prepared: Prepared, calib, opts: CompileOptions, path: str | Path, cfg: NpuConfig):
    """A float model quantised as `opts` say: (the QDQ model, the quantisation's description)."""
    model = prepared.model
    if calib is None:
        raise CompileError(f"{path}: a float model needs calibration data (--calib calib.npy)")
    calib = _nchw_calibration(prepared, calib, path)
    model = cleanup(model)
    per_channel = per_channel_choice(model, opts.weight_scales, str(path))
    clamped = clamped_by_quantisation(model)
    split: list[str] = []
    if opts.weight_precision == "int16":
        model, split = split_weights(model, per_channel, set(opts.wide_layers) or None)
    n_samples = min(len(a) for a in calib.values()) if isinstance(calib, Mapping) else len(calib)
    quantisation = (
        f"{opts.activations} activations ({opts.calib_method} calibration, {n_samples} samples), "
        f"weights per {'channel' if per_channel else 'tensor'} ({opts.weight_scales}), "
        f"outputs {opts.output_precision}"
    )
    if split:
        quantisation += f", int16 weights ({len(split)} layers as an int8 layer and its residual's)"
    float_clean = copied(model)  # the float graph the quantiser sees (the accuracy guard's reference)
    mix, ranges = None, None
    if opts.activations == "mixed":
        ranges = calibrated_ranges_of(model, calib, opts.calib_method, str(path))

        def quantize(int16: set[str]) -> onnx.ModelProto:
            return quantize_float_model(
                model, calib, str(path), per_channel=per_channel, calib_method=opts.calib_method,
                activations="mixed", int16=int16, ranges=ranges,
            )  # fmt: skip

        batches = calibration_batches(model, calib, str(path))
        wide = with_headroom(ranges, clipped_tensors(model))
        # most models keep int16 everywhere (precision.py, the response test): a large one's int16
        # quantisation starts in a second process beside the choice (compiler/parallel.py)
        everywhere, key = None, None
        args = (model, calib, str(path), per_channel, opts.calib_method, "mixed", set(wide), ranges)
        if opts.parallel and parallel.worth(parallel.weight_bytes(model), parallel.MIN_WEIGHT_BYTES):
            key = quantisation_key(*args)
            key = None if is_kept(key) else key  # quantised in this process already: taken from there
        how = ", the int16 quantisation in a second process" if key else ""
        stage(f"choosing int8 or int16 per activation (onnxruntime on calibration samples{how})")
        try:
            everywhere = parallel.start(quantize_float_model, *args) if key else None
            mix = precision.choose(
                model, batches, wide, quantize, opts.target_cosine, cfg.macs_per_cycle, cfg.vector_lanes,
                a16_full_rate=cfg.a16_full_rate,
            )
        finally:
            wanted = mix is not None and mix.qdq is None and mix.int16 == set(wide)
            if everywhere is not None and not wanted:
                everywhere.close()  # not needed: a mix the choice quantised itself (or an error)
                everywhere = None
        quantisation = quantisation.replace("mixed activations", mix.describe())
        if everywhere is not None:
            mix.qdq = everywhere.result()  # None if the child failed: quantised here below
            if mix.qdq is not None:
                remember(key, mix.qdq)  # as if quantised here (a retry with a smaller arena takes it)
    if mix is not None and mix.qdq is not None:
        model = mix.qdq  # the selection (or the second process) quantised this very mix already
    else:
        model = quantize_float_model(
            model, calib, str(path), per_channel=per_channel, calib_method=opts.calib_method,
            activations=opts.activations, int16=mix.int16 if mix else None, ranges=ranges,
        )  # fmt: skip
    if opts.weight_rounding != "nearest" or opts.bias_correction:
        batches = calibration_batches(float_clean, calib, str(path))
    if opts.weight_rounding != "nearest":
        model, rounded = round_weights(model, float_clean, batches, str(path), opts.weight_rounding)
        quantisation += f"; {rounded.describe()}"
    if opts.bias_correction:
        model, biased = correct_biases(model, float_clean, batches)
        quantisation += f"; {biased.describe()}"
    if opts.output_precision == "int32":
        kept = keep_output_precision(model, str(path), clamped=clamped)
        prepared.notes += [f"{what}: {how}" for what, how in kept]
    return model, quantisation, clamped, float_clean, mix


def _lower(
    model, plan_cfg: NpuConfig, opts: CompileOptions, path, prepared: Prepared, reasons=None, host_nodes=None
) -> Lowering:
    """Lower into the configuration's DRAM; if every tensor at its own range does not fit, the
    arena may: lower into a virtual DRAM as large as the address field allows (timing does not
    depend on it; the planned addresses are checked against the real DRAM after assembly)."""
    kw = dict(step=opts.step(plan_cfg), max_live=opts.cp_max_live, nhwc_inputs=set(prepared.nhwc_inputs))
    kw["reasons"], kw["host_nodes"] = reasons, host_nodes
    kw["narrow_depthwise"], kw["im2col"] = opts.narrow_depthwise, opts.im2col
    try:
        return lower(model, plan_cfg, str(path), **kw)
    except DramFull:
        if opts.resolved_dram_plan == "bump":
            raise
        return lower(model, dataclasses.replace(plan_cfg, dram_bytes=VIRTUAL_DRAM), str(path), **kw)


def _compile(
    prepared: Prepared, cfg: NpuConfig, calib, opts: CompileOptions, path, auto: bool = False
) -> CompiledModel:
    """The pass pipeline after loading: quantise, lower, order, assemble, relocate into the
    regions; then the accuracy guard (compiler/accuracy.py) for a float model. `auto`: an int8/int16
    mix the guard refuses is not repaired but raises _MixRefused (int16 everywhere comes next), and
    int16 weights in some layers (auto's repair) are checked as `_check_weights` says."""
    t0 = time.perf_counter()
    model = prepared.model
    if is_qdq(model):
        return _build(model, prepared, cfg, opts, path, "the model's own (QDQ)", False, t0)
    check = None
    if opts.accuracy_check and calib is not None:
        float_model = copied(model)
        calib, check = accuracy.hold_back(model, calib, prepared.nhwc_inputs, str(path))
    unchecked = auto and check is None  # a mix auto chooses stands on the golden-model check
    if unchecked:
        opts = opts.replace(activations="int16")
    stage(f"quantising ({opts.activations} activations, onnxruntime calibration)")
    model, quantisation, clamped, float_clean, mix = _quantize(prepared, calib, opts, path, cfg)
    if unchecked:
        quantisation += " (int16 everywhere: without the accuracy check auto takes no int8 tensor)"
    if check is not None:
        use = "held back for" if check.held_back else "reused by"
        quantisation += f" ({check.samples} {use} the accuracy check)"
    qdq = copied(model)  # before lowering keeps results float in place: a repair starts from it again
    notes = list(prepared.notes)
    if check is None:
        return _build(model, prepared, cfg, opts, path, quantisation, True, t0, clamped)
    quick = (auto and mix is not None and len(mix.int16) < mix.tensors) or bool(opts.wide_layers)
    if opts.weight_precision == "auto" or (auto and opts.wide_layers):  # (the latter: auto's repair)
        nchw = _nchw_calibration(prepared, calib, path)
        _check_weights(qdq, float_clean, check, nchw, cfg, opts, path, quick)
    # The guard checks values, which neither the operator order nor the cancellation points change:
    # it runs on builds without the order search and the points, and only the build it accepts is
    # searched and given its points (a refused one, or a repair's trials, cost no search).
    built: dict[int, tuple] = {}

    def values(m: onnx.ModelProto, prep: Prepared, host_nodes: dict[str, str] | None) -> CompiledModel:
        lowering, regions = _lowered(m, prep, cfg, opts, path, True, clamped, host_nodes)
        a = (lowering, regions, m, prep, cfg, opts, path, quantisation, t0)
        reuse = Reuse()  # the build without points, which the timed assembly's first one is
        try:
            got, full = _assembled(*a, timed=False, reuse=reuse), False
        except DramTooSmall:  # in the ONNX order: the searched order's arena may fit
            got, full = _assembled(*a), True
        built[id(got)] = (got, a, full, reuse)
        return got

    def rebuild(host_nodes: dict[str, str]) -> CompiledModel:
        return values(copied(qdq), dataclasses.replace(prepared, notes=list(notes)), host_nodes)

    compiled = values(model, prepared, None)
    _, a, full, reuse = built[id(compiled)]
    # a large program's check runs in a second process while this one searches the order and
    # assembles the build the check is likely to accept (compiler/parallel.py)
    work = len(compiled.lowered.program) * check.samples
    beside = not full and opts.parallel and parallel.worth(work, parallel.MIN_INSTRUCTIONS)
    how = ", in a second process beside the order search" if beside else ""
    stage(f"accuracy check on {check.samples} calibration samples (golden model against onnxruntime{how})")
    outputs, ahead, failed, runs = None, None, None, None
    # the child also times the build's segments first, for the timed assembly's first build (the
    # same program where the search keeps the ONNX order; not relocated into regions)
    times = parallel.SegmentTimes() if beside and a[1] is None else None
    try:
        if beside:
            raw = compiled._container().to_bytes()
            runs = parallel.start(parallel.golden_runs, raw, cfg, check.inputs, times and times.path)
        if runs is not None:
            if times is not None:
                times.child, reuse.times = runs, times.get
            try:
                ahead = _assembled(*a, reuse=reuse)
            except Exception as e:  # noqa: BLE001 - raised below only if this build is the one kept
                failed = e
            except BaseException:  # an interrupt: stop the child too
                runs.close()
                raise
            outputs = runs.result()
    finally:
        if times is not None:
            times.close()
        reuse.times = lambda _k: None  # the child's file is gone
    hint = "--activations int16, " if opts.activations != "int16" else ""
    args = (float_model, float_clean, check, opts.target_cosine, rebuild, str(path), hint)
    # some int8 (auto's next step is int16), or int16 weights in some layers (next: in every one):
    # refused at once, without repair rounds
    try:
        kw = dict(rounds=0, explain=False) if quick else {}
        checked = accuracy.guard(compiled, *args, outputs=outputs, **kw)
    except AccuracyError as e:
        raise (_MixRefused(str(e)) if quick else e) from None
    if checked is compiled and runs is not None:
        if failed is not None:
            raise failed
        final = ahead
    else:
        _, a, full, reuse = built[id(checked)]
        final = checked if full else _assembled(*a, reuse=reuse)
    final.accuracy = checked.accuracy
    return final


def _check_weights(
    qdq: onnx.ModelProto, float_clean, check, calib, cfg: NpuConfig, opts: CompileOptions, path, quick: bool
) -> None:
    """Before lowering: the float model with only `qdq`'s int8 weights on the check samples and on
    as many calibration samples as `accuracy.in_sample_batches` allows (onnxruntime). Below the
    target no activation type and no host placement reaches it: an AccuracyError (a _MixRefused
    when `quick`) at once, with `weights_lose` (that cosine) and `wide` (the layers whose int8
    weights lose the most, compiler/wide_weights.py) for the repair. The repair's own layers
    (`wide_layers`) must leave the int8 rest within half the target's error (`choose_wide` aims at
    a quarter): inputs beyond the samples lose more than the samples (a test input 0.987 where the
    int8 rest of a one-layer repair read 0.9903 on the worst of 32), and the next step is int16
    weights in every layer."""
    batches = calibration_batches(float_clean, calib, path)
    macs = sum(layer_macs(qdq).values())
    extra = accuracy.in_sample_batches(batches, macs)
    feeds = [*check.feeds, *extra]
    want = accuracy.float_outputs(float_clean, feeds)
    base = accuracy.output_losses(accuracy.with_quantised_weights(qdq, float_clean), want, feeds)
    least = 1.0 - float(base.max())
    goal = 1.0 - (1.0 - opts.target_cosine) / 2 if opts.wide_layers else opts.target_cosine
    if least >= goal:
        return
    if not opts.wide_layers:
        stage(f"int8 weights alone reach cosine {least:.4f}: choosing the layers that lose the most")
    where = f"{check.samples} {'held-back ' if check.held_back else ''}calibration sample(s)"
    where += f" and {len(extra)} in-sample one(s)" if extra else ""
    msg = (
        f"{path}: with only its int8 weights quantised (activations float, onnxruntime) the model "
        f"reaches cosine {least:.4f} on {where}, below "
        + (f"{goal:g} (half the target's error, for int8 weights beside int16 ones)" if opts.wide_layers
           else f"the target {goal:g}")
    )  # fmt: skip
    refused = _MixRefused(msg) if quick else AccuracyError(msg)
    errors = weight_errors(qdq, float_clean, batches)
    costs = matrix_steps(float_clean, cfg.lanes)
    layers = choose_wide(
        qdq, float_clean, feeds, want, base, errors, costs, opts.target_cosine, macs, opts.wide_layers
    )
    refused.weights_lose, refused.wide = least, tuple(layers)  # type: ignore[attr-defined]
    raise refused


def _build(
    model, prepared: Prepared, cfg: NpuConfig, opts: CompileOptions, path, quantisation: str,
    float_model: bool, t0: float, clamped=frozenset(), host_nodes: dict[str, str] | None = None,
) -> CompiledModel:  # fmt: skip
    """Lower (`host_nodes` on the host), order, assemble and relocate a QDQ model."""
    lowering, regions = _lowered(model, prepared, cfg, opts, path, float_model, clamped, host_nodes)
    return _assembled(lowering, regions, model, prepared, cfg, opts, path, quantisation, t0)


def _lowered(
    model, prepared: Prepared, cfg: NpuConfig, opts: CompileOptions, path, float_model: bool,
    clamped=frozenset(), host_nodes: dict[str, str] | None = None,
) -> tuple[Lowering, Regions | None]:  # fmt: skip
    """A QDQ model lowered (`host_nodes` on the host) inside the on-chip regions the options give."""
    regions = region.resolve(cfg, opts.spad_region, opts.acc_region)
    plan_cfg = region.view(cfg, regions) if regions else cfg  # the passes plan inside the regions
    moved = f" again, {len(host_nodes or ())} operators moved to the host by the accuracy guard"
    stage("lowering" + (moved if host_nodes else ""))
    lowering = _lower(model, plan_cfg, opts, path, prepared, host_nodes=host_nodes)
    if opts.output_precision == "int32" and float_model:
        # host operators placed so by their lowering's conditions (not known before lowering)
        host = {f.layer.node: f.layer.reason or "" for f in lowering.frags if f.kind == "host"}
        kept = keep_output_precision(model, str(path), set(host), clamped)
        if kept:
            prepared.notes += [f"{what}: {how}" for what, how in kept]
            lowering = _lower(model, plan_cfg, opts, path, prepared, host, host_nodes)
    return lowering, regions


def _assembled(
    lowering: Lowering, regions: Regions | None, model, prepared: Prepared, cfg: NpuConfig,
    opts: CompileOptions, path, quantisation: str, t0: float, timed: bool = True,
    reuse: Reuse | None = None,
) -> CompiledModel:  # fmt: skip
    """Order (the search), assemble with cancellation points and relocate a lowering. Not `timed`:
    only the values matter (the accuracy guard's builds): the ONNX order, no points. `reuse`
    (`assemble`'s): left by the build without timing, taken by the timed one."""
    search = None
    if timed and opts.order == "search":
        stage(f"searching the operator order ({len(lowering.frags)} operators)")
        search = search_order(
            lowering,
            budget_s=opts.order_budget_s,
            exhaustive_limit=opts.exhaustive_limit,
            # as the final program has them: a point at every operator boundary, or with an
            # interval, only where the interval needs one (the operators between overlap)
            cancel_points=opts.cancel_points and not opts.interval(cfg),
            objective=opts.order_objective,
        )
    policy = (
        PointPolicy(opts.interval(cfg), opts.cp_max_live, opts.cp_every_instruction)
        if opts.cancel_points and timed
        else None
    )
    stage("assembling programs and placing cancellation points" if timed else "assembling (values only)")

    def build(order: list[int] | None) -> Lowered:
        args = (opts.granularity, opts.resolved_dram_plan, opts.step_cycles, timed)
        return assemble(lowering, order, policy, *args, reuse)

    if search is None:
        low = build(None)
    else:
        low = whole_program(search, len(lowering.frags), build)
    base = round_up(low.dram_end, 4096)
    if base + len(low.program) * 32 > cfg.dram_bytes:
        dp = low.dram_plan
        raise DramTooSmall(
            f"{path}: weights, activations and program need more than the "
            f"{cfg.dram_bytes} bytes of DRAM on {cfg.name}: {dp.const_bytes} bytes of constants, "
            f"{dp.arena_bytes} of activations ({dp.mode}; at least {dp.lower_bound} live at once), "
            f"{len(low.program) * 32} of program"
        )
    if regions:  # planned in [0, size): move every on-chip address into the regions
        low.program = region.relocate(low.program, regions)
        low.points = region.relocate_points(low.points, regions)
        region.check_inside(low.program, regions, cfg)
    return CompiledModel(
        cfg, low, base, model, str(path), time.perf_counter() - t0, search, opts.granularity,
        prepared.notes, regions, quantisation,
    )  # fmt: skip

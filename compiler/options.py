"""`CompileOptions`: every option of `compile_onnx`, each defined once with its choices, default and
help. The passes take their choices from here, `npu compile`'s arguments are generated from the
fields (`add_arguments`), and a bad value is a CompileError naming the option and its choices."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from npu.config import NpuConfig

from .errors import CompileError

ORDERS = ("search", "default")
OBJECTIVES = ("cycles", "memory")
GRANULARITIES = ("segment", "operator", "step")
DRAM_PLANS = ("arena", "bump")
WEIGHT_SCALES = ("auto", "per-channel", "per-tensor")
CALIB_METHODS = ("minmax", "percentile", "entropy")
ACTIVATIONS = ("int8", "int16", "mixed")  # what the quantiser takes; the option adds "auto"
OUTPUT_PRECISIONS = ("int32", "int8")
ROUNDINGS = ("auto", "nearest", "gptq")
WEIGHT_PRECISIONS = ("auto", "int8", "int16")
#: default bound on the gap between cancellation points (a latency budget, not a cycle count)
MAX_PAUSE_US = 500.0


def region(text: str) -> tuple[int, int]:
    """START:SIZE, each decimal or 0x hex with an optional K (x 1024) suffix (an argparse type)."""
    start, colon, size = text.partition(":")

    def num(t: str) -> int:
        t = t.strip()
        k = t[-1:] in ("k", "K")
        return int(t[:-1] if k else t, 0) * (1024 if k else 1)

    try:
        if not colon:
            raise ValueError
        return num(start), num(size)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not START:SIZE in bytes (decimal or 0x, K = 1024), e.g. 0:128K"
        ) from None


def input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """NAME=D1xD2x... with positive dimensions (an argparse type)."""
    name, eq, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        shape = ()
    if not eq or not name or not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=D1xD2x... with dimensions >= 1, e.g. input=1x3x224x224"
        )
    return name, shape


class OptionError(CompileError):
    """A bad value of one option (`option`: the field's name)."""

    def __init__(self, option: str, msg: str):
        super().__init__(msg)
        self.option = option


def _option(default: Any, help: str, *, choices: Sequence | None = None, flag: str | None = None,
            type: Callable | None = None, metavar: str | None = None, minimum: float | None = None,
            cli: str = "value") -> Any:  # fmt: skip
    """A field with its command-line form: `cli` is "value", "flag" (store_true), "toggle"
    (--x/--no-x), "append" (repeated NAME=VALUE pairs into a mapping) or "list" (repeated values
    into a tuple)."""
    meta = {"help": help, "choices": choices, "flag": flag, "type": type, "metavar": metavar,
            "minimum": minimum, "cli": cli}  # fmt: skip
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class CompileOptions:
    """How `compile_onnx` compiles a model (each field's metadata holds its help)."""

    order: str = _option(
        "search", "operator order: search (key-node partitioned, golden-model timing) or default "
        "(the ONNX order)", choices=ORDERS)  # fmt: skip
    order_objective: str = _option(
        "cycles", "what the order search minimises: cycles (golden-model timing, default) or memory "
        "(the most activation bytes live at once, the DRAM arena's lower bound; ties by cycles)",
        choices=OBJECTIVES)  # fmt: skip
    order_budget_s: float | None = _option(
        10.0, "time limit of the order search (s), shared among its subgraphs by their estimated cycles",
        flag="--order-budget", type=float, metavar="S", minimum=1e-9)  # fmt: skip
    exhaustive_limit: int = _option(
        120, "the order search tries every order of a subgraph with at most this many, and samples "
        "larger ones", type=int, metavar="N", minimum=1)  # fmt: skip
    activations: str = _option(
        "auto", "a float model's activation type: int16 (symmetric, twice the calibrated range, int8 "
        "weights: keeps the accuracy int8 activations lose on real models), int8 (asymmetric: half the "
        "bytes, and half the matrix cycles on an array that takes int16 at half rate), mixed (int8 where "
        "the model's outputs stay within half the --target-cosine error on calibration samples, "
        "int16 elsewhere: compiler/precision.py), or auto (default: mixed, int16 everywhere when the "
        "mix fails the accuracy check or the check is off, int8 when the int16 model does not fit the "
        "configuration: the report says why)",
        choices=("auto", *ACTIVATIONS))  # fmt: skip
    weight_scales: str = _option(
        "auto", "how a float model's weights are quantised: one scale per output channel (accurate; "
        "requantised through a per-column table, a few %% more cycles), one per tensor, or auto "
        "(default: per channel when one scale would leave some channel 1/8 of the int8 range or less)",
        choices=WEIGHT_SCALES)  # fmt: skip
    weight_precision: str = _option(
        "auto", "a float model's weights: int8, int16 (each matrix operator as an int8 layer and a "
        "layer of its rounding residual, added: about 15 bits of weight for twice the matrix steps: "
        "compiler/wide_weights.py), or auto (default: int8, int16 where the accuracy check finds "
        "that the int8 weights lose the model's accuracy)", choices=WEIGHT_PRECISIONS)  # fmt: skip
    wide_layers: tuple[str, ...] = _option(
        (), "with --weight-precision int16: only this matrix operator (its ONNX node name; repeat for "
        "several) takes int16 weights (default: every one)", flag="--wide-layer", metavar="NODE",
        cli="list")  # fmt: skip
    calib_method: str = _option(
        "minmax", "how a float model's activation ranges come from the calibration inputs "
        "(onnxruntime's calibrators): the extremes seen (default), the 99.999th percentile, or entropy",
        choices=CALIB_METHODS)  # fmt: skip
    weight_rounding: str = _option(
        "auto", "which int8 value each of a float model's weights takes: nearest; gptq: per layer, the "
        "rounding that lowers its output error on the calibration inputs (GPTQ; a layer keeps the "
        "nearest where that is better); auto (default): gptq's if the whole model's outputs on the "
        "calibration inputs come out closer to the float model's, else nearest",
        choices=ROUNDINGS)  # fmt: skip
    bias_correction: bool = _option(
        True, "correct each layer's int32 bias for the mean error its int8 weights' rounding adds to "
        "its outputs on the calibration inputs (default on)", cli="toggle")  # fmt: skip
    output_precision: str = _option(
        "int32", "a float model's outputs: int32 (default: a Gemm/MatMul read only as a graph output or "
        "by host operators such as Softmax stores its int32 accumulators, dequantised on the host with "
        "one scale per column, so logits are neither clipped nor rounded to the calibrated int8 scale) "
        "or int8 (the calibrated output scale)", choices=OUTPUT_PRECISIONS)  # fmt: skip
    accuracy_check: bool = _option(
        True, "run the compiled float model against onnxruntime float on calibration samples (held "
        "back from calibration when there are 8 or more) and repair or refuse a result below "
        "--target-cosine", cli="toggle")  # fmt: skip
    parallel: bool = _option(
        True, "run independent steps of a large model's compile in a second process: the accuracy "
        "check's golden-model runs beside the order search and assembly, the int16 quantisation beside "
        "the int8/int16 choice (machines with 2 or more cores; default on)", cli="toggle")  # fmt: skip
    target_cosine: float = _option(
        0.99, "the least cosine per output the accuracy check accepts (default 0.99)", type=float,
        metavar="C", minimum=0)  # fmt: skip
    cancel_points: bool = _option(
        True, "place cancellation points (the driver pauses a running model at them)", cli="toggle"
    )
    cp_interval: int = _option(
        0, "cancellation points at most N estimated cycles apart where possible, operators cut to fit "
        "(default 0: from --max-pause-us)", type=int, metavar="N", minimum=0)  # fmt: skip
    max_pause_us: float = _option(
        MAX_PAUSE_US, "the longest a running model may go without a cancellation point - the wait of an "
        "urgent model - in microseconds at the configuration's clock (default 500: 50,000 cycles at "
        "100 MHz); operators are cut and points placed inside them to keep every gap within it where "
        "a point can go (the report gives the largest gap); 0: points at operator boundaries only",
        type=float, metavar="US", minimum=0)  # fmt: skip
    cp_max_live: int | None = _option(
        None, "skip interior points whose live on-chip data exceed BYTES (default: prefer points "
        "within a quarter of the scratchpad, taking a larger one only where no smaller one keeps the "
        "gap within the interval)", type=int, metavar="BYTES", minimum=0)  # fmt: skip
    cp_every_instruction: bool = _option(
        False, "a cancellation point after every instruction where no dependency token is outstanding "
        "(for tests of preemption)", cli="flag")  # fmt: skip
    granularity: str = _option(
        "segment", "segment: NPU operators back to back (default); operator: every operator its own unit "
        "of work (DRAM in, DRAM out) with the operator graph, for scheduling across engines; step: as "
        "operator, with operators also cut into chained segments of about --step-cycles, for the "
        "layer-wise scheduler of several models on one engine", choices=GRANULARITIES)  # fmt: skip
    step_cycles: int = _option(
        20_000, "--granularity step: cost-model cycles per segment of a cut operator (default 20000)",
        type=int, metavar="CYCLES", minimum=1)  # fmt: skip
    dram_plan: str | None = _option(
        None, "where activations live in DRAM: arena (shared by liveness in the chosen order) or bump "
        "(every tensor its own range); default: arena for --granularity segment, else bump",
        choices=DRAM_PLANS)  # fmt: skip
    input_shapes: Mapping[str, Sequence[int]] = _option(
        {}, "static shape of a graph input with dynamic dimensions (repeat for several inputs)",
        flag="--input-shape", type=input_shape, metavar="NAME=1x3x224x224", cli="append")  # fmt: skip
    narrow_depthwise: bool = _option(
        True, "a depthwise convolution of int16 input runs a MATMUL per A word of channels (half the "
        "matrix steps, twice the MATMULs; default on); off: one per chunk, a smaller program (taken "
        "again by itself when the program does not fit the DRAM)", cli="toggle")  # fmt: skip
    im2col: str = _option(
        "auto", "a strided convolution of few input channels with its taps folded into k, its band "
        "gathered by the LOADs (one MATMUL a band instead of one per output row and tap; a graph input "
        "read only so is laid out without channel padding): auto (where the cost model finds it "
        "cheaper), on (wherever it applies), off", choices=("auto", "on", "off"))  # fmt: skip
    spad_region: tuple[int, int] | None = _option(
        None, "use only these bytes of the scratchpad (e.g. 0:128K; numbers decimal or 0x, K = 1024), "
        "so models resident at once never touch each other's on-chip data", type=region,
        metavar="START:SIZE")  # fmt: skip
    acc_region: tuple[int, int] | None = _option(
        None, "use only these bytes of the accumulator memory (START:SIZE, offsets into it; default: "
        "the scratchpad region's share of it)", type=region, metavar="START:SIZE")  # fmt: skip

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value, meta = getattr(self, f.name), f.metadata
            if value is None:
                continue
            if meta["choices"] and value not in meta["choices"]:
                raise CompileError(f"{f.name} must be one of {', '.join(meta['choices'])}, not {value!r}")
            if meta["minimum"] is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value < meta["minimum"]
            ):
                least = "a positive number" if meta["minimum"] == 1e-9 else f"a number >= {meta['minimum']}"
                raise OptionError(f.name, f"{f.name} must be {least}, not {value!r}")
        if self.target_cosine > 1:
            raise OptionError("target_cosine", f"target_cosine must be at most 1, not {self.target_cosine!r}")

    def replace(self, **changes: Any) -> CompileOptions:
        """A copy with `changes`; an unknown option is a CompileError listing the known ones."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise CompileError(f"unknown compile option {unknown[0]!r}; options: {', '.join(sorted(names))}")
        return dataclasses.replace(self, **changes)

    @property
    def resolved_dram_plan(self) -> str:
        return self.dram_plan or ("arena" if self.granularity == "segment" else "bump")

    def interval(self, cfg: NpuConfig) -> int:
        """Estimated cycles wanted between cancellation points: --cp-interval, else --max-pause-us at
        the configuration's clock; 0 without points (or with one after every instruction)."""
        if self.cp_interval:
            return self.cp_interval
        if not self.cancel_points or self.cp_every_instruction:
            return 0
        return round(self.max_pause_us * cfg.clock_mhz)

    def step(self, cfg: NpuConfig) -> int:
        """The longest step an operator is split into (lower.py splits at half of it; 0: no limit)."""
        wanted = (self.interval(cfg), self.step_cycles if self.granularity == "step" else 0)
        return min((c for c in wanted if c > 0), default=0)


def flag_of(f: dataclasses.Field) -> str:
    """A CompileOptions field's command-line flag (`cp_interval` -> `--cp-interval`, unless it names one)."""
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """One command-line argument per field of CompileOptions, with its default, choices and help."""
    for f in dataclasses.fields(CompileOptions):
        meta = f.metadata
        flag = flag_of(f)
        default = f.default if f.default is not dataclasses.MISSING else None
        help = meta["help"]
        if meta["cli"] == "flag":
            p.add_argument(flag, dest=f.name, action="store_true", help=help)
        elif meta["cli"] == "toggle":
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                           help=help)  # fmt: skip
        elif meta["cli"] == "append":
            p.add_argument(flag, dest=f.name, action="append", type=meta["type"], default=[],
                           metavar=meta["metavar"], help=help)  # fmt: skip
        elif meta["cli"] == "list":
            p.add_argument(flag, dest=f.name, action="append", default=[], metavar=meta["metavar"], help=help)
        elif meta["cli"] == "value":
            p.add_argument(flag, dest=f.name, default=default, choices=meta["choices"], type=meta["type"],
                           metavar=meta["metavar"], help=help)  # fmt: skip


def from_arguments(args: argparse.Namespace) -> CompileOptions:
    """The options `add_arguments` parsed (repeated NAME=VALUE pairs checked for duplicates)."""
    values = {}
    for f in dataclasses.fields(CompileOptions):
        value = getattr(args, f.name)
        if f.metadata["cli"] == "list":
            value = tuple(value)
        if f.metadata["cli"] == "append":
            pairs, value = value, dict(value)
            if len(value) < len(pairs):
                names = [n for n, _ in pairs]
                twice = next(n for n in names if names.count(n) > 1)
                raise CompileError(f"{flag_of(f)} {twice} is given twice")
        values[f.name] = value
    try:
        return CompileOptions(**values)
    except OptionError as e:  # name the option as the user wrote it
        f = next(f for f in dataclasses.fields(CompileOptions) if f.name == e.option)
        flag = flag_of(f)
        raise OptionError(e.option, str(e).replace(e.option, flag, 1)) from None

"""The `.npub` program container (docs/container.md): one compiled model, ready for a device.

Layout (little-endian):

    offset  size  field
    0       4     magic b"NPUB"
    4       2     format version (2)
    6       2     reserved, 0
    8       4     configuration id the program was compiled for
    12      4     manifest length M (bytes of UTF-8 JSON)
    16      8     payload length P
    24      32    SHA-256 of manifest + payload
    56      M     manifest (JSON)
    56+M    P     payload (the blobs the manifest points into)

The manifest is typed here, once: the compiler builds a `Manifest`, the driver, executor, simulator
runner and CLI read its attributes. Loading validates every field against these types, so a
checksum-valid file with a missing or mistyped field is a `ContainerError` naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import struct
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from npu.errors import NpuError

from .config import ACC_BASE, PRESETS, NpuConfig
from .files import write_atomic
from .isa import FORMATS, INSTR_BYTES, OFFSETS, Opcode
from .tensors import Layout

MAGIC = b"NPUB"
VERSION = 2
HEADER = struct.Struct("<4sHHIIQ32s")


class ContainerError(NpuError, ValueError):
    """A file that is not a valid container; the message names the file and the problem."""


# ---- manifest types --------------------------------------------------------------------------------


@dataclass
class TensorDesc:
    """A quantised tensor in DRAM at `addr`, elements placed by `layout`: int8 with real value =
    scale x (q - zero_point), or (with `scales`) int32 accumulator values with real value =
    scales[c] x q, c the index along axis 1 (a Gemm's output column)."""

    name: str
    shape: list[int]
    scale: float
    zero_point: int
    addr: int
    layout: Layout
    scales: list[float] | None = None


@dataclass
class HostTensor:
    """A float model output computed by a host step, or a float model input only host steps read
    (never in DRAM)."""

    name: str
    shape: list[int]
    host: Literal[True] = True


@dataclass
class HostIO:
    """A host step's graph input or quantised result: the float name and the DRAM tensor it is read
    from or written to (None: a float from an earlier host step or a model input)."""

    float: str
    tensor: TensorDesc | None


@dataclass
class NpuSegment:
    """Start the device at `pc`; the range ends with END at `end`. `deps`: the segments whose
    results it reads (None: the segment before it). `est_cycles`: the cost model's runtime;
    `ref_cycles`: the runtime measured alone on a quiet engine (`npu profile`; None until then).

    A layer-wise scheduler's inputs (None in older files): `spad_bytes`/`acc_bytes`, the extent of
    the scratchpad and accumulator bytes the segment touches; `dma_rd_bytes`/`dma_wr_bytes`, the
    DRAM bytes its LOADs read and its STOREs write; `dma_cycles`/`compute_cycles`, the cost model's
    busy cycles of the DMA units (load + store) and of the compute units (the busier of matrix and
    vector).

    `chained` (granularity "step"): the segment continues an operator cut into steps on the on-chip
    data the segment before it left (recorded as live at that segment's end point), so it must run
    right after it on the same engine with that data in place."""

    pc: int
    end: int
    kind: Literal["npu"] = "npu"
    deps: list[int] | None = None
    est_cycles: int | None = None
    ref_cycles: int | None = None
    spad_bytes: int | None = None
    acc_bytes: int | None = None
    dma_rd_bytes: int | None = None
    dma_wr_bytes: int | None = None
    dma_cycles: int | None = None
    compute_cycles: int | None = None
    chained: bool = False


@dataclass
class HostStep:
    """Operators evaluated on the host: blob `model` (a small ONNX graph) fed from `inputs`, with the
    `quantize` results written back to DRAM for later NPU segments."""

    model: str
    inputs: list[HostIO]
    quantize: list[HostIO]
    nodes: list[str]
    kind: Literal["host"] = "host"
    deps: list[int] | None = None  # as NpuSegment.deps


Segment = NpuSegment | HostStep


@dataclass
class Layer:
    """One operator in program order. NPU operators carry their pc range and the cost model's
    figures; `ref_cycles` is a measured reference runtime (None until profiled)."""

    node: str
    op: str
    placement: Literal["npu", "host", "view"]
    shape: list[int]
    reason: str | None = None  # host: why not on the NPU
    pc: list[int] | None = None  # npu: [first, end)
    est_cycles: int | None = None
    compute_cycles: int | None = None
    dma_cycles: int | None = None
    split: str | None = None  # conv/pool: how the operator was divided to fit the scratchpad
    tile: dict[str, int] | None = None
    spad_bytes: int | None = None
    ref_cycles: int | None = None


@dataclass
class CancelPoint:
    """A cancellation point and the on-chip ranges live across it (what a preemption dumps)."""

    id: int
    pc: int
    kind: Literal["spill", "interval"]
    segment: int
    est_cycles: int
    live_ranges: list[list[int]]  # [start, end) on-chip byte ranges
    live_bytes: int
    dump_cycles: int
    restore_cycles: int
    #: the cost model's cycle at which the first instruction after it starts in any unit (None:
    #: placed on estimates, nothing after it, or an older file): a pause asked from then on stops
    #: at the next point, at its `est_cycles`
    est_first_start: int | None = None


@dataclass
class DramImage:
    """Constant DRAM contents (weights, biases) written before a run."""

    addr: int
    blob: str


@dataclass
class ProgramInfo:
    base: int  # DRAM byte address of instruction 0
    instructions: int


@dataclass
class Manifest:
    config: str  # configuration name (informative; the header's id decides)
    program: ProgramInfo
    dram: list[DramImage]
    inputs: list[TensorDesc | HostTensor]  # HostTensor: a float input only host steps read
    outputs: list[TensorDesc | HostTensor]
    segments: list[Segment]
    layers: list[Layer]
    cancel_points: list[CancelPoint]
    #: "segment": NPU operators run back to back in as few segments as host steps allow;
    #: "operator": every operator is its own segment (DRAM in, DRAM out) with its dependencies;
    #: "step": as "operator", with operators cut between steps into chained segments
    granularity: Literal["segment", "operator", "step"] = "segment"
    #: the on-chip bytes the program may touch, [start, size]: scratchpad bytes, and accumulator
    #: bytes as offsets into the accumulator memory (on-chip addresses ACC_BASE + offset); None:
    #: the whole memory (`npu compile --spad-region/--acc-region`)
    spad_region: list[int] | None = None
    acc_region: list[int] | None = None

    def to_json(self) -> dict:
        return _encode(self)

    @classmethod
    def from_json(cls, d: Any, source: str = "manifest") -> Manifest:
        """The manifest of a decoded JSON object; raises ContainerError naming a bad field."""
        return _decode(cls, d, source)

    def blob_names(self) -> list[str]:
        """Every payload blob the manifest refers to."""
        return (
            ["program"]
            + [d.blob for d in self.dram]
            + [s.model for s in self.segments if isinstance(s, HostStep)]
        )

    def tensors(self) -> list[TensorDesc]:
        """Every DRAM tensor description: model inputs and outputs, host step inputs and results."""
        out = [t for t in self.inputs + self.outputs if isinstance(t, TensorDesc)]
        for s in self.segments:
            if isinstance(s, HostStep):
                out += [io.tensor for io in s.inputs + s.quantize if io.tensor is not None]
        return out

    def segment_deps(self) -> list[list[int]]:
        """For each segment, the segments it depends on (an unset `deps` means the one before)."""
        return [
            list(s.deps) if s.deps is not None else ([i - 1] if i else [])
            for i, s in enumerate(self.segments)
        ]

    def onchip_ranges(self, cfg: NpuConfig) -> list[tuple[int, int]]:
        """The on-chip [start, end) address ranges the program may touch on `cfg`: its scratchpad
        region and its accumulator region (at ACC_BASE +); the whole memories when unset."""
        s0, sn = self.spad_region or (0, cfg.spad_bytes)
        a0, an = self.acc_region or (0, cfg.acc_bytes)
        return [(s0, s0 + sn), (ACC_BASE + a0, ACC_BASE + a0 + an)]

    def shares_onchip(self, other: Manifest, cfg: NpuConfig) -> bool:
        """Whether this model and `other`, both resident on one engine of `cfg`, may touch the same
        on-chip bytes (their regions overlap)."""
        return any(a < d and c < b for a, b in self.onchip_ranges(cfg) for c, d in other.onchip_ranges(cfg))

    def point_table(self) -> dict[int, CancelPoint]:
        return {p.id: p for p in self.cancel_points}

    def relocated(self, off: int) -> Manifest:
        """The same model placed `off` bytes higher in DRAM (see `relocate`). The parts with
        addresses are new objects (shared descriptions stay shared); the rest is shared."""
        moved: dict[int, TensorDesc] = {}

        def mv(t):
            if not isinstance(t, TensorDesc):
                return t
            if id(t) not in moved:
                moved[id(t)] = dataclasses.replace(t, addr=t.addr + off)
            return moved[id(t)]

        def io(x: HostIO) -> HostIO:
            return dataclasses.replace(x, tensor=mv(x.tensor) if x.tensor is not None else None)

        return dataclasses.replace(
            self,
            program=dataclasses.replace(self.program, base=self.program.base + off),
            dram=[dataclasses.replace(d, addr=d.addr + off) for d in self.dram],
            inputs=[mv(t) for t in self.inputs],
            outputs=[mv(t) for t in self.outputs],
            segments=[
                dataclasses.replace(s, inputs=[io(x) for x in s.inputs], quantize=[io(x) for x in s.quantize])
                if isinstance(s, HostStep)
                else s
                for s in self.segments
            ],
        )


def relocate(manifest: Manifest, program: bytes, off: int) -> tuple[Manifest, bytes]:
    """The same model placed `off` bytes higher in DRAM: every DRAM address in the manifest and in the
    program's LOAD/STORE instructions moves."""
    return manifest.relocated(off), relocate_program(program, off)


def relocate_program(program: bytes, off: int) -> bytes:
    """`program` with the DRAM address of every LOAD and STORE moved by `off` bytes."""
    out = bytearray(program)
    for i in range(0, len(out) - len(out) % INSTR_BYTES, INSTR_BYTES):
        op = out[i] & 0xF
        if op not in _DRAM_FIELD:  # only LOAD and STORE address DRAM: patch their field in place
            continue
        lo, mask = _DRAM_FIELD[op]
        word = int.from_bytes(out[i : i + INSTR_BYTES], "little")
        addr = ((word >> lo) & mask) + off
        if not 0 <= addr <= mask:
            raise ContainerError(f"pc {i // INSTR_BYTES}: DRAM address 0x{addr:x} does not fit its field")
        word = word & ~(mask << lo) | addr << lo
        out[i : i + INSTR_BYTES] = word.to_bytes(INSTR_BYTES, "little")
    return bytes(out)


_DRAM_FIELD = {
    int(op): (OFFSETS[op]["dram"], (1 << next(f.width for f in FORMATS[op] if f.name == "dram")) - 1)
    for op in (Opcode.LOAD, Opcode.STORE)
}


# ---- JSON <-> types, with validation --------------------------------------------------------------


def _encode(v: Any) -> Any:
    if isinstance(v, Layout):
        return v.to_json()
    if dataclasses.is_dataclass(v):
        # optional fields that are unset are left out (a host layer has no pc, ...)
        return {
            f.name: _encode(getattr(v, f.name))
            for f in dataclasses.fields(v)
            if not (getattr(v, f.name) is None and f.default is None)
        }
    if isinstance(v, list | tuple):
        return [_encode(x) for x in v]
    if isinstance(v, dict):
        return {k: _encode(x) for k, x in v.items()}
    return v


@functools.cache
def _hints(tp: type) -> dict[str, Any]:
    return typing.get_type_hints(tp)


def _kind_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _decode(tp: Any, v: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if v is None:
            if type(None) in options:
                return None
            raise ContainerError(f"{path}: null, expected {' or '.join(_kind_name(o) for o in options)}")
        options = [o for o in options if o is not type(None)]
        return _decode(_pick(options, v, path), v, path)
    if origin is Literal:
        if v not in typing.get_args(tp):
            raise ContainerError(f"{path}: {v!r} is not one of {list(typing.get_args(tp))}")
        return v
    if origin is list:
        if not isinstance(v, list):
            raise ContainerError(f"{path}: expected a list, found {type(v).__name__}")
        (item,) = typing.get_args(tp)
        return [_decode(item, x, f"{path}[{i}]") for i, x in enumerate(v)]
    if origin is dict:
        if not isinstance(v, dict):
            raise ContainerError(f"{path}: expected an object, found {type(v).__name__}")
        _, item = typing.get_args(tp)
        return {k: _decode(item, x, f"{path}.{k}") for k, x in v.items()}
    if tp is Layout:
        try:
            return Layout.from_json(v)
        except (KeyError, TypeError, ValueError) as e:
            raise ContainerError(f"{path}: not a tensor layout ({e!r})") from None
    if dataclasses.is_dataclass(tp):
        if not isinstance(v, dict):
            raise ContainerError(f"{path}: expected an object, found {type(v).__name__}")
        hints = _hints(tp)
        kw = {}
        for f in dataclasses.fields(tp):
            if f.name in v:
                kw[f.name] = _decode(hints[f.name], v[f.name], f"{path}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ContainerError(f"{path}.{f.name}: missing")
        return tp(**kw)
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ContainerError(f"{path}: expected a number, found {v!r}")
        return float(v)
    if tp in (int, str, bool):
        if not isinstance(v, tp) or (tp is int and isinstance(v, bool)):
            raise ContainerError(f"{path}: expected {tp.__name__}, found {v!r}")
        return v
    raise TypeError(f"no decoder for {tp!r}")  # a manifest type this module does not handle


def _pick(options: list, v: Any, path: str) -> Any:
    """The member of a union a JSON object is: segments by `kind`, outputs by the `host` flag."""
    if len(options) == 1:
        return options[0]
    if not isinstance(v, dict):
        raise ContainerError(f"{path}: expected an object, found {type(v).__name__}")
    kinds = {f.default: o for o in options for f in dataclasses.fields(o) if f.name == "kind"}
    if kinds:
        if v.get("kind") not in kinds:
            raise ContainerError(f"{path}.kind: {v.get('kind')!r} is not one of {sorted(kinds)}")
        return kinds[v["kind"]]
    return HostTensor if v.get("host") else TensorDesc


# ---- the file ---------------------------------------------------------------------------------------


@dataclass
class Container:
    config_id: int
    manifest: Manifest
    blobs: dict[str, bytes] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        payload = bytearray()
        man = self.manifest.to_json()
        index = {}
        for name, data in self.blobs.items():
            index[name] = {"offset": len(payload), "length": len(data)}
            payload += data
        man["blobs"] = index
        mb = json.dumps(man, sort_keys=True).encode()
        digest = hashlib.sha256(mb + bytes(payload)).digest()
        return HEADER.pack(MAGIC, VERSION, 0, self.config_id, len(mb), len(payload), digest) + mb + payload

    def save(self, path: str | Path) -> None:
        """Write atomically: a temporary file beside `path`, renamed over it once complete, so an
        interrupted save (disk full, a size limit, Ctrl-C) leaves the old file whole."""
        write_atomic(path, self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<bytes>") -> Container:
        if len(data) < HEADER.size:
            raise ContainerError(f"{source}: {len(data)} bytes is too short for an .npub header")
        magic, version, reserved, config_id, mlen, plen, digest = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise ContainerError(f"{source}: not an .npub container (magic {magic!r})")
        if version != VERSION:
            raise ContainerError(f"{source}: container format version {version}, this tool reads {VERSION}")
        if reserved:
            raise ContainerError(f"{source}: reserved header field is 0x{reserved:04x}, must be 0")
        body = data[HEADER.size :]
        if len(body) != mlen + plen:
            raise ContainerError(
                f"{source}: truncated or padded: header says {mlen + plen} bytes of body, found {len(body)}"
            )
        if hashlib.sha256(body).digest() != digest:
            raise ContainerError(f"{source}: checksum mismatch (the file is corrupt)")
        try:
            raw = json.loads(body[:mlen])
        except ValueError as e:
            raise ContainerError(f"{source}: manifest is not JSON: {e}") from None
        if not isinstance(raw, dict):
            raise ContainerError(f"{source}: the manifest is not a JSON object")
        index = _decode(dict[str, _BlobRef], raw.pop("blobs", {}), f"{source}: manifest.blobs")
        man = Manifest.from_json(raw, f"{source}: manifest")
        preset = PRESETS.get(man.config)
        if preset is not None and preset.config_id != config_id:
            raise ContainerError(
                f"{source}: header configuration id 0x{config_id:08x} is not the manifest's "
                f"{man.config} (0x{preset.config_id:08x})"
            )
        payload = body[mlen:]
        blobs = {}
        for name, ref in index.items():
            if ref.offset < 0 or ref.length < 0 or ref.offset + ref.length > len(payload):
                raise ContainerError(
                    f"{source}: manifest.blobs.{name}: [{ref.offset}, +{ref.length}) is outside the "
                    f"{len(payload)}-byte payload"
                )
            blobs[name] = payload[ref.offset : ref.offset + ref.length]
        for name in man.blob_names():
            if name not in blobs:
                raise ContainerError(f"{source}: manifest.blobs: no blob {name!r}, which the manifest uses")
        return cls(config_id, man, blobs)

    @classmethod
    def load(cls, path: str | Path) -> Container:
        p = Path(path)
        try:
            return cls.from_bytes(p.read_bytes(), str(p))
        except FileNotFoundError:
            raise ContainerError(f"{p}: no such file") from None
        except IsADirectoryError:
            raise ContainerError(f"{p}: is a directory, not an .npub file") from None


@dataclass
class _BlobRef:
    offset: int
    length: int

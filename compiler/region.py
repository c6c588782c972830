"""On-chip regions: a model compiled to use only part of the scratchpad and of the accumulators, so
that several models resident on one engine never touch each other's on-chip data.

The passes plan inside a region by lowering for a *region view* of the configuration: the same engine
with `spad_bytes`/`acc_bytes` set to the regions' sizes, so every tiling decision, buffer address,
chunk size and live range is computed for [0, size). `relocate` then moves every on-chip address of
the assembled program (and the cancellation points' live ranges) to the regions' starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from npu.config import ACC_BASE, NpuConfig
from npu.container import CancelPoint
from npu.isa import ONCHIP_ADDR_FIELDS, Instr, IsaError, footprint, validate

from .graph import CompileError


@dataclass(frozen=True)
class Regions:
    """Byte ranges of the scratchpad ([spad_start, +spad_size)) and of the accumulator memory
    ([acc_start, +acc_size), offsets into it: on-chip addresses ACC_BASE + offset)."""

    spad_start: int
    spad_size: int
    acc_start: int
    acc_size: int

    def describe(self) -> str:
        return (
            f"scratchpad region [0x{self.spad_start:x}, 0x{self.spad_start + self.spad_size:x}) "
            f"({self.spad_size} bytes), accumulator region [0x{self.acc_start:x}, "
            f"0x{self.acc_start + self.acc_size:x}) ({self.acc_size} bytes)"
        )

    def contains(self, start: int, end: int) -> bool:
        """Whether the on-chip byte range [start, end) lies inside one of the regions."""
        if start >= ACC_BASE:
            lo = ACC_BASE + self.acc_start
            return lo <= start and end <= lo + self.acc_size
        return self.spad_start <= start and end <= self.spad_start + self.spad_size


@dataclass(frozen=True)
class RegionView(NpuConfig):
    """The engine as the passes see it inside regions: its memories have the regions' sizes. Only
    the compiler plans with it (programs and containers keep the real configuration), so the
    hardware's power-of-two rules on memory sizes do not apply to it."""

    # where the regions start on the real engine, for error messages
    spad_start: int = 0
    acc_start: int = 0
    #: a banked scratchpad less a block at its top: its halves stay the engine's (0: half the size)
    bank_half: int = 0

    @property
    def spad_half(self) -> int:
        return self.bank_half or self.spad_bytes // 2

    def validate(self) -> None:  # the real configuration was validated; the regions by `resolve`
        pass


def memory_name(cfg: NpuConfig, acc: bool = False) -> str:
    """'the N-byte scratchpad' (or accumulators), naming the region when planning inside one."""
    size = cfg.acc_bytes if acc else cfg.spad_bytes
    if isinstance(cfg, RegionView):
        start = cfg.acc_start if acc else cfg.spad_start
        what = "accumulator" if acc else "scratchpad"
        return f"the {size}-byte {what} region [0x{start:x}, 0x{start + size:x})"
    return f"the {size}-byte {'accumulator memory' if acc else 'scratchpad'}"


def _check(name: str, start: int, size: int, memory: int, what: str, unit: int, why: str) -> None:
    if size <= 0:
        raise CompileError(f"{name} ({start}, {size}) is empty: its size must be positive")
    if start < 0 or start + size > memory:
        raise CompileError(
            f"{name} [0x{start:x}, 0x{start + size:x}) is outside the {memory}-byte {what} "
            f"[0x0, 0x{memory:x})"
        )
    for what, v in (("start", start), ("size", size)):
        if v % unit:
            raise CompileError(f"{name} {what} {v} is not a multiple of {unit} bytes ({why})")


def resolve(
    cfg: NpuConfig, spad_region: tuple[int, int] | None, acc_region: tuple[int, int] | None
) -> Regions | None:
    """Check the requested regions and fill in the defaults (None: no region, the whole memories).
    Without `acc_region`, the accumulator region is the same fraction of the accumulator memory as
    the scratchpad region is of the scratchpad (rounded inwards to whole rows), so disjoint
    scratchpad regions get disjoint accumulator regions; without `spad_region`, the whole scratchpad."""
    if spad_region is None and acc_region is None:
        return None
    if cfg.spad_banked:
        raise CompileError(
            f"on-chip regions are not supported on {cfg.name}: its banked scratchpad keeps weights and "
            "activations in fixed halves"
        )
    row = cfg.acc_row_bytes
    s0, sn = spad_region if spad_region is not None else (0, cfg.spad_bytes)
    lanes = f"MATMUL operands are {cfg.lanes}-byte aligned"
    _check("spad_region", s0, sn, cfg.spad_bytes, "scratchpad", cfg.lanes, lanes)
    if acc_region is None:
        lo = -(-s0 * cfg.acc_bytes // cfg.spad_bytes // row) * row
        hi = (s0 + sn) * cfg.acc_bytes // cfg.spad_bytes // row * row
        if hi <= lo:
            raise CompileError(
                f"spad_region [0x{s0:x}, 0x{s0 + sn:x}) leaves no whole accumulator row ({row} bytes) "
                "in the proportional accumulator region; give acc_region"
            )
        acc_region = (lo, hi - lo)
    a0, an = acc_region
    rows = f"accumulator rows are {row} bytes"
    _check("acc_region", a0, an, cfg.acc_bytes, "accumulator memory", row, rows)
    return Regions(s0, sn, a0, an)


def view(cfg: NpuConfig, r: Regions) -> RegionView:
    """The configuration the passes plan with inside `r`."""
    return planning_view(
        cfg, spad_bytes=r.spad_size, acc_bytes=r.acc_size, spad_start=r.spad_start, acc_start=r.acc_start
    )


def planning_view(cfg: NpuConfig, **changes) -> RegionView:
    """`cfg` as the passes see it with `changes` (smaller memories, a region's start): a RegionView,
    so sizes need not be powers of two. A view of a view keeps its region's start."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    return RegionView(**{**fields, **changes})


def relocate(instrs: list[Instr], r: Regions) -> list[Instr]:
    """The program with every on-chip address moved from the region view's [0, size) to the regions."""
    out = []
    for ins in instrs:
        names = ONCHIP_ADDR_FIELDS.get(ins.op)
        if names:
            f = dict(ins.fields)
            for name in names:
                f[name] += r.acc_start if f[name] >= ACC_BASE else r.spad_start
            ins = dataclasses.replace(ins, fields=f)
        out.append(ins)
    return out


def relocate_points(points: list[CancelPoint], r: Regions) -> list[CancelPoint]:
    """The cancellation points with their live ranges moved into the regions."""

    def mv(s: int, e: int) -> list[int]:
        d = r.acc_start if s >= ACC_BASE else r.spad_start
        return [s + d, e + d]

    return [dataclasses.replace(p, live_ranges=[mv(s, e) for s, e in p.live_ranges]) for p in points]


def check_inside(instrs: list[Instr], r: Regions, cfg: NpuConfig) -> None:
    """Every instruction is valid on the real engine and touches on-chip bytes inside the regions
    only (a relocation that missed a field would show here, not as another model's corrupted data)."""
    for pc, ins in enumerate(instrs):
        try:
            validate(ins, cfg)
        except IsaError as e:
            raise AssertionError(f"pc {pc}: relocated into {r.describe()}: {e}") from None
        reads, writes = footprint(ins)
        for s in reads + writes:
            if s.space == "onchip" and not r.contains(s.start, s.end):
                raise AssertionError(
                    f"pc {pc}: {ins.op.name} touches [0x{s.start:x}, 0x{s.end:x}) outside {r.describe()}"
                )

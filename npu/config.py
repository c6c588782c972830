"""Hardware configuration: the one object that sizes the RTL, the compiler and the golden model.

Every width, depth and latency is a field here; nothing else in the stack may hard-code one. The
configuration id (a 32-bit hash of the hardware fields) is stored in every program container and in a
read-only register, so a program built for one configuration is refused by another.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from npu.errors import NpuError
from npu.registers import MAX_ENGINES

#: The on-chip address space is fixed by the ISA: scratchpad bytes at [0, ACC_BASE), accumulator
#: bytes at [ACC_BASE, 2 * ACC_BASE). Each memory may be smaller than its window.
ACC_BASE = 0x8_0000
ONCHIP_ADDR_BITS = 20


class ConfigError(NpuError, ValueError):
    """A hardware configuration that cannot be built; the message names the field."""


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class NpuConfig:
    """Parameters of one NPU engine (and of the SoC around it)."""

    name: str
    #: rows of the MAC array: output rows (M) computed per cycle
    clusters: int
    #: PEs per cluster: output columns (N) computed per cycle
    pes_per_cluster: int
    #: int8 multiply-accumulate lanes per PE: reduction depth (K) per cycle
    lanes: int
    #: scratchpad (int8 data: inputs, weights, outputs) in bytes, and its bank count
    spad_bytes: int
    spad_banks: int
    #: accumulator memory (int32) in bytes
    acc_bytes: int
    #: elements (int8 or int32) processed per cycle by the vector unit
    vector_lanes: int
    #: AXI data bus width in bytes (DMA moves one beat of this many bytes per cycle)
    bus_bytes: int
    #: DRAM visible to the engine, in bytes
    dram_bytes: int
    #: NPU engines in the SoC
    engines: int = 1
    #: scratchpad built from dual-port block-RAM banks: two regions (activations in the lower half,
    #: weights - MATMUL B operands - in the upper half), spad_banks / 2 banks each, lane words
    #: interleaved modulo that count; conflicting accesses stall (docs/isa.md, Timing)
    spad_banked: bool = False
    #: nominal clock in MHz (used to turn cycles into time)
    clock_mhz: float = 100.0
    #: instructions each unit queue holds between dispatch and execution
    queue_depth: int = 8
    #: dependency tokens one channel can hold before TOKEN error
    token_depth: int = 255
    #: cycles from a DMA request to its first beat
    dma_latency: int = 16
    #: bytes the DRAM moves a cycle when it is narrower than the bus (a board's SDR SDRAM: 2), so a
    #: bus word takes bus_bytes / dram_word_bytes cycles and the fetcher, the load and the store
    #: units take turns on it; 0: a bus word a cycle on separate read and write channels
    dram_word_bytes: int = 0
    #: with dram_word_bytes: cycles each burst costs besides its words (the request, row activation
    #: and read latency the memory does not overlap with the previous burst, refresh on average)
    dram_burst_cycles: int = 0
    #: pipeline latency of one matrix instruction
    matrix_latency: int = 4
    #: pipeline latency of one vector instruction (hdl/vector.py: two setup cycles, seven stages)
    vector_latency: int = 11
    #: the engine's implementation: "pipelined" (hdl/core.py: the units run in parallel) or "micro"
    #: (hdl/micro/: one control processor runs the ISA from firmware, for the smallest FPGAs)
    core: str = "pipelined"
    #: int16 A at int8's rate: each lane multiplies an int16 A element (16 x 8 bits) and a cluster
    #: reads two A lane words a step, so an int16 MATMUL takes int8's steps (twice the A reads and
    #: the multiplier width). False: a lane multiplies one A byte and an int16 A takes twice the
    #: steps (docs/isa.md, Timing; docs/compiler.md, "int16 at the array's int8 rate")
    a16_full_rate: bool = False
    #: A rows staged in the matrix unit (hdl/matrix.py): bytes of its A row each cluster holds in a
    #: buffer of its own, filled through two scratchpad reads a cycle before an m tile's steps (a
    #: longer row in chunks of this many bytes), so the scratchpad serves two A readers whatever the
    #: clusters; 0: every cluster reads its A words from the scratchpad each step
    a_stage_bytes: int = 0
    #: the matrix unit's accumulator clients for its C rows, a read and a write one each: 0, one a
    #: cluster; n, the clusters' rows share n (row i on client i mod n, in turn when several ask),
    #: which the accumulators' two banks a region allow a cycle anyway (docs/boards.md)
    c_clients: int = 0

    def __post_init__(self) -> None:
        self.validate()

    # -- derived quantities -------------------------------------------------------------------
    @property
    def macs_per_cycle(self) -> int:
        return self.clusters * self.pes_per_cluster * self.lanes

    @property
    def a16_second_port(self) -> bool:
        """Whether the matrix unit reads each cluster's second A word of an int16 step (with
        `a16_full_rate`) through the scratchpad banks' write port (B) rather than with the other
        reads on port A: on a banked scratchpad whose region has fewer banks than the clusters'
        2 x `clusters` A words of a step (docs/isa.md, "Banked memories")."""
        return (
            self.a16_full_rate
            and self.spad_banked
            and not self.a_stage_bytes
            and self.spad_banks // 2 < 2 * self.clusters
        )

    @property
    def a_readers(self) -> int:
        """The matrix unit's A reads of the scratchpad a cycle: the two staging reads, or a word a
        cluster."""
        return 2 if self.a_stage_bytes else self.clusters

    @property
    def c_ports(self) -> int:
        """The matrix unit's C row clients of the accumulators, a read and a write one each:
        `c_clients`, or one a cluster."""
        return self.c_clients or self.clusters

    @property
    def acc_row_bytes(self) -> int:
        """Bytes of one accumulator word: one int32 per PE of a cluster."""
        return 4 * self.pes_per_cluster

    @property
    def spad_half(self) -> int:
        """Where the scratchpad's upper half starts: a banked scratchpad's second region."""
        return self.spad_bytes // 2

    @property
    def instr_beats(self) -> int:
        """Bus beats needed to fetch one 32-byte instruction."""
        return max(1, 32 // self.bus_bytes)

    # -- validation and identity -----------------------------------------------------------------
    def validate(self) -> None:
        def need(cond: bool, field: str, why: str) -> None:
            if not cond:
                raise ConfigError(f"config {self.name!r}: {field}={getattr(self, field)!r} is invalid: {why}")

        for f in ("clusters", "pes_per_cluster", "lanes", "vector_lanes", "engines"):
            need(isinstance(getattr(self, f), int) and getattr(self, f) >= 1, f, "must be >= 1")
        need(self.engines <= MAX_ENGINES, "engines", f"the SoC's register space holds at most {MAX_ENGINES}")
        for f in ("lanes", "pes_per_cluster", "vector_lanes"):
            need(_pow2(getattr(self, f)), f, "must be a power of two")
        # int16 activations (docs/isa.md): a matrix step reads lanes / 2 int16 elements of one lane
        # word; a vector step takes vector_lanes int16 elements, 2 * vector_lanes bytes
        need(self.lanes >= 2, "lanes", "must be >= 2 (int16 matrix steps take half as many elements)")
        need(self.vector_lanes >= 2, "vector_lanes", "must be >= 2")
        if self.spad_banked:
            need(
                self.spad_banks % 2 == 0
                and self.spad_banks // 2
                >= max(2, self.a_readers, self.pes_per_cluster, self.bus_bytes // self.lanes),
                "spad_banks",
                "banked: must be even, with at least max(2, clusters (unless A is staged), "
                "pes_per_cluster, bus_bytes / lanes) banks per region",
            )
        else:
            need(_pow2(self.spad_banks), "spad_banks", "must be a power of two")
        need(self.bus_bytes in (4, 8, 16, 32, 64), "bus_bytes", "must be one of 4, 8, 16, 32, 64")
        need(
            _pow2(self.spad_bytes) and 1024 <= self.spad_bytes <= ACC_BASE,
            "spad_bytes",
            f"must be a power of two between 1 KiB and {ACC_BASE} bytes",
        )
        need(
            self.spad_banked or self.spad_bytes % (self.spad_banks * self.lanes) == 0,
            "spad_banks",
            "scratchpad must divide into banks of whole lane words",
        )
        need(
            _pow2(self.acc_bytes) and 256 <= self.acc_bytes <= ACC_BASE,
            "acc_bytes",
            f"must be a power of two between 256 and {ACC_BASE} bytes",
        )
        need(self.acc_bytes % self.acc_row_bytes == 0, "acc_bytes", "must hold whole rows")
        # one memory word width everywhere: a DMA beat, an accumulator row (pes int32) and the
        # widest vector access are all bus_bytes
        need(
            self.acc_row_bytes == self.bus_bytes,
            "pes_per_cluster",
            f"4 * pes_per_cluster must equal bus_bytes ({self.bus_bytes})",
        )
        need(self.lanes <= self.bus_bytes, "lanes", f"must not exceed bus_bytes ({self.bus_bytes})")
        # the vector unit reads and writes each operand of a step as two words: any element-aligned
        # step of int16 fits two lane words where 2 * vector_lanes <= lanes; the pipelined core also
        # takes steps of two whole words (vector_lanes <= lanes), which must then be word-aligned
        # (npu.isa.wide_operands; the micro core's firmware keeps the narrower rule)
        wide = self.core == "pipelined"
        need(
            (self.vector_lanes if wide else 2 * self.vector_lanes) <= self.lanes,
            "vector_lanes",
            f"must be at most {'' if wide else 'half of '}lanes ({self.lanes}): a step moves "
            "2 * vector_lanes bytes of int16 within two lane words",
        )
        need(self.core in ("pipelined", "micro"), "core", 'must be "pipelined" or "micro"')
        need(
            not self.a16_full_rate or self.core == "pipelined",
            "a16_full_rate",
            "the micro core's firmware multiplies int16 A at its own rate",
        )
        need(
            self.core == "micro" or 2 * self.vector_lanes <= self.bus_bytes,
            "vector_lanes",
            f"2 * vector_lanes must not exceed bus_bytes ({self.bus_bytes}): a step reads at most two "
            "accumulator words of int32",
        )
        need(
            _pow2(self.dram_bytes) and 4096 <= self.dram_bytes <= 1 << 32,
            "dram_bytes",
            "must be a power of two between 4 KiB and 4 GiB",
        )
        need(self.clock_mhz > 0, "clock_mhz", "must be positive")
        need(1 <= self.queue_depth <= 64, "queue_depth", "must be 1..64")
        need(1 <= self.token_depth <= 255, "token_depth", "must be 1..255")
        for f in ("dma_latency", "matrix_latency", "vector_latency", "dram_burst_cycles"):
            need(0 <= getattr(self, f) <= 1024, f, "must be 0..1024")
        need(
            self.dram_word_bytes == 0
            or (_pow2(self.dram_word_bytes) and self.dram_word_bytes < self.bus_bytes),
            "dram_word_bytes",
            f"must be 0 or a power of two below bus_bytes ({self.bus_bytes})",
        )
        self._validate_staging(need)

    def _validate_staging(self, need) -> None:
        need(
            self.a_stage_bytes == 0
            or (_pow2(self.a_stage_bytes) and self.a_stage_bytes >= 2 * self.lanes and self.core != "micro"),
            "a_stage_bytes",
            f"must be 0 or a power of two of at least two lane words ({2 * self.lanes}), pipelined core",
        )
        need(
            self.c_clients == 0 or (0 < self.c_clients < self.clusters and self.core != "micro"),
            "c_clients",
            f"must be 0 or fewer than the clusters ({self.clusters}), pipelined core",
        )

    def hardware_dict(self) -> dict:
        """All fields that change the hardware (everything but the name)."""
        d = dataclasses.asdict(self)
        d.pop("name")
        if not d["spad_banked"]:
            d.pop("spad_banked")  # ids of the multi-port configurations stay what they were
        if d["core"] == "pipelined":
            d.pop("core")
        # ids of the configurations from before these fields
        for f in ("dram_word_bytes", "dram_burst_cycles", "a16_full_rate", "a_stage_bytes", "c_clients"):
            if not d[f]:
                d.pop(f)
        return d

    @property
    def config_id(self) -> int:
        """Stable 32-bit id of the hardware parameters (first 4 bytes of a SHA-256)."""
        blob = json.dumps(self.hardware_dict(), sort_keys=True).encode()
        return int.from_bytes(hashlib.sha256(blob).digest()[:4], "little")

    def replace(self, **changes) -> NpuConfig:
        return dataclasses.replace(self, **changes)

    @property
    def engine(self) -> NpuConfig:
        """One engine of this SoC (`engines` = 1): what each engine's CONFIG_ID reports and what a
        model is compiled for, so a model built for `default` runs on every engine of `duo`."""
        if self.engines == 1:
            return self
        one = self.replace(engines=1)
        known = config_by_id(one.config_id)
        return known if known is not None else one.replace(name=f"{self.name}-engine")

    def describe(self) -> str:
        return (
            f"{self.name}: {self.clusters}x{self.pes_per_cluster}x{self.lanes} = "
            f"{self.macs_per_cycle} MACs/cycle, scratchpad {self.spad_bytes // 1024} KiB "
            f"in {self.spad_banks} {'dual-port ' if self.spad_banked else ''}"
            f"bank{'s' if self.spad_banks > 1 else ''}, "
            f"accumulators {self.acc_bytes // 1024} KiB, "
            f"vector {self.vector_lanes} lanes, bus {self.bus_bytes * 8} bits, "
            f"DRAM {_size(self.dram_bytes)}, id 0x{self.config_id:08x}"
            + (f", {self.engines} engines sharing the DRAM port" if self.engines > 1 else "")
            + (
                f", micro core (the ISA run from firmware, MATMUL on a MAC array of "
                f"{4 * MICRO_MAC_COLUMNS} int8 MACs/cycle: docs/micro.md)"
                if self.core == "micro"
                else ""
            )
            + (", int16 A at the int8 rate" if self.a16_full_rate else "")
        )


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


PRESETS: dict[str, NpuConfig] = {
    # Small enough for an iCE40 UP5K: 8 MACs (its 8 DSP blocks), 64-bit bus, SPRAM-sized memories.
    "tiny": NpuConfig(
        name="tiny",
        clusters=1,
        pes_per_cluster=2,
        lanes=4,
        spad_bytes=16 * 1024,
        spad_banks=2,
        acc_bytes=4 * 1024,
        vector_lanes=2,
        bus_bytes=8,
        dram_bytes=64 * 1024,
        clock_mhz=24.0,
        queue_depth=4,
        dma_latency=8,
        matrix_latency=3,
        vector_latency=10,
    ),
    # ECP5-class: 128 MACs per cycle, 128-bit AXI; int16 activations at the int8 rate (each lane a
    # 16 x 8 multiplier, within an FPGA DSP block's 18 x 18: docs/isa.md, "int16 activations");
    # an 8-lane vector unit whose int16 and int32 steps take two whole words (docs/compiler.md,
    # "An 8-lane vector unit")
    "default": NpuConfig(
        name="default",
        clusters=4,
        pes_per_cluster=4,
        lanes=8,
        spad_bytes=256 * 1024,
        spad_banks=8,
        acc_bytes=64 * 1024,
        vector_lanes=8,
        bus_bytes=16,
        dram_bytes=64 * 1024 * 1024,
        clock_mhz=100.0,
        queue_depth=8,
        dma_latency=16,
        matrix_latency=4,
        vector_latency=11,
        a16_full_rate=True,
    ),
}
# `default` with a block-RAM scratchpad: 2 regions x 5 dual-port banks (npu bench banks); int16 A
# at half rate: the 5 banks of a region serve the 4 clusters' A words a cycle, not 8
PRESETS["banked"] = PRESETS["default"].replace(
    name="banked", spad_banks=10, spad_banked=True, a16_full_rate=False
)
# `default` with 64-entry unit queues, for several models on one engine (layer-wise scheduling,
# docs/driver.md): the dispatcher runs ahead of a long layer's compute, so the loads of the next
# model's layer, queued behind it in the ring, reach the load queue and run under that compute
PRESETS["multi"] = PRESETS["default"].replace(name="multi", queue_depth=64)
# two `default` engines sharing one DRAM port (hdl/soc.py)
PRESETS["duo"] = PRESETS["default"].replace(name="duo", engines=2)
# board presets (hdl/boards/, docs/boards.md): block-RAM (banked) memories sized for the part
# ULX3S (ECP5-85F): 16 MACs, 64 KiB scratchpad, its 32 MB SDR SDRAM at 50 MHz
PRESETS["ulx3s"] = NpuConfig(
    name="ulx3s",
    clusters=1,
    pes_per_cluster=2,
    lanes=8,
    spad_bytes=64 * 1024,
    # a power of two per region: bank and row are address bits (Fmax); 2 per region, as 4 per
    # region's read crossbars do not route on the 85F (docs/boards.md)
    spad_banks=4,
    spad_banked=True,
    acc_bytes=16 * 1024,
    vector_lanes=2,
    bus_bytes=8,
    dram_bytes=32 * 1024 * 1024,
    clock_mhz=50.0,
    queue_depth=4,
    # the SDR SDRAM behind the register slice and the interconnect (hdl/mem/sdram.py): 16 bits a
    # cycle; latency and burst cost measured by the DMA probes of `npu bench board` (docs/boards.md)
    dma_latency=20,
    dram_word_bytes=2,
    dram_burst_cycles=8,
    matrix_latency=3,
    vector_latency=10,
    # int16 A at the int8 rate: a lane multiplies 16 x 8 bits on its MULT18X18D (the DSP it takes
    # for 9 x 8), and the one cluster reads its step's second A word from the other bank of the
    # activations' region (docs/boards.md)
    a16_full_rate=True,
)
# ULX3S with 128 MACs: a 4 x 4 x 8 array on 128 of the 85F's 156 MULT18X18D, a 128-bit bus (the
# SDRAM controller serialises it into 16-bit beats), 8 banks for the 4 clusters' A words
PRESETS["ulx3s128"] = PRESETS["ulx3s"].replace(
    name="ulx3s128", clusters=4, pes_per_cluster=4, bus_bytes=16, spad_banks=8, a16_full_rate=False
)
# ULX3S with 128 MACs on the 16-MAC preset's memories: 8 x 2 x 8, each cluster's A row staged in
# the matrix unit (two scratchpad reads fill the eight buffers before an m tile), so the scratchpad
# keeps the 64-bit bus, its four banks and the 32-MAC preset's read clients, and the eight clusters'
# C rows share two accumulator clients (docs/boards.md)
PRESETS["ulx3s128s"] = PRESETS["ulx3s"].replace(name="ulx3s128s", clusters=8, a_stage_bytes=4096, c_clients=2)
# half of it, 4 x 2 x 8 = 64 MACs staged the same way: about 90 % of its speed on the tinyML set
# (their DRAM traffic bounds both) in fewer cells (docs/boards.md)
PRESETS["ulx3s64s"] = PRESETS["ulx3s128s"].replace(name="ulx3s64s", clusters=4, c_clients=0)
# ULX3S with 32 MACs, the board's own (hdl/boards/boards.py): two clusters of the 16-MAC preset's
# 1 x 2 x 8, int16 A at half rate (docs/boards.md: the 64- and 128-MAC shapes do not route yet; at
# the int8 rate, its second A words through the banks' port B, it is 15-19 % faster per inference
# but its builds routed at 49.88 and 49.23 MHz, short of the board's 50)
PRESETS["ulx3s32"] = PRESETS["ulx3s"].replace(name="ulx3s32", clusters=2, a16_full_rate=False)
#: the micro core's MAC array (hdl/micro/mac.py, hdl/micro/memmap.py): output columns a block, and
#: staged B entries a column (a word of four int8 elements each; for int16 A a word takes two)
MICRO_MAC_COLUMNS = 4
MICRO_MAC_MAX_WORDS = 256

# iCEBreaker (iCE40 UP5K): the micro core (hdl/micro/), the ISA run by a control processor from
# firmware; two of the four SPRAMs hold the scratchpad, the accumulators and the firmware's data, two
# are the DRAM (docs/boards.md)
PRESETS["icebreaker"] = PRESETS["tiny"].replace(
    name="icebreaker",
    core="micro",
    pes_per_cluster=1,
    spad_bytes=32 * 1024,
    spad_banks=1,
    acc_bytes=8 * 1024,
    bus_bytes=4,
    clock_mhz=12.0,
)


def get_config(name_or_config: str | NpuConfig | dict) -> NpuConfig:
    """A preset by name (or pass a configuration through, or build one from a dict of every field,
    as simulation benches receive a test's own); unknown names list the choices."""
    if isinstance(name_or_config, NpuConfig):
        return name_or_config
    if isinstance(name_or_config, dict):
        return NpuConfig(**name_or_config)
    try:
        return PRESETS[name_or_config]
    except KeyError:
        raise ConfigError(
            f"unknown configuration {name_or_config!r}; choose one of {', '.join(PRESETS)}"
        ) from None


def config_by_id(config_id: int) -> NpuConfig | None:
    for cfg in PRESETS.values():
        if cfg.config_id == config_id:
            return cfg
    return None

"""Control/status register map, shared by the hardware, the golden model and the driver.

All registers are 32 bits wide at 4-byte aligned offsets on an AXI4-Lite slave. 64-bit counters are a
LO/HI pair; reading LO latches HI so a pair read is consistent. `docs/registers.md` is the prose.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.lib import enum  # Python enums that also give hardware signals their shape

NPU_MAGIC = 0x3155504E  # "NPU1" little-endian
ISA_VERSION = 3  # 2: the command ring and FENCE; 3: tokens may cross a cancellation point (RESUME_TOKENS)


class Control(enum.IntFlag, shape=4):
    START = 1 << 0  # write 1: start fetching at PROGRAM_BASE + 32 * RESUME_PC (ignored unless stopped)
    PAUSE = 1 << 1  # write 1: request a pause at the next cancellation point; reads back pending
    SOFT_RESET = 1 << 2  # write 1: abort, clear queues/tokens/errors, go IDLE (memories keep data)
    IRQ_ENABLE = 1 << 3  # interrupt line follows IRQ.PENDING when set


class Status(enum.IntFlag, shape=6):
    IDLE = 1 << 0
    RUNNING = 1 << 1
    PAUSED = 1 << 2
    DONE = 1 << 3
    ERROR = 1 << 4
    WAITING = 1 << 5  # running from the command ring, which is empty: everything up to TAIL is done


@dataclass(frozen=True)
class Register:
    name: str
    offset: int
    access: str  # "ro", "rw", "w1c" (write one to clear) or "wo"
    doc: str
    wide: bool = False  # 64-bit counter: LO at offset, HI at offset + 4


REGISTERS: tuple[Register, ...] = (
    Register("ID", 0x00, "ro", f"magic 0x{NPU_MAGIC:08x} ('NPU1')"),
    Register("VERSION", 0x04, "ro", "ISA version"),
    Register("CONFIG_ID", 0x08, "ro", "hardware configuration id (NpuConfig.config_id)"),
    Register("CONTROL", 0x0C, "rw", "bits START, PAUSE, SOFT_RESET, IRQ_ENABLE (see below)"),
    Register("STATUS", 0x10, "ro", "one of IDLE, RUNNING, PAUSED, DONE, ERROR, WAITING (see below)"),
    Register("IRQ", 0x14, "w1c", "bit 0: pending; set when the core leaves RUNNING or a FENCE completes"),
    Register("PROGRAM_BASE", 0x18, "rw", "DRAM byte address of instruction 0 (32-byte aligned)"),
    Register("RESUME_PC", 0x1C, "rw", "instruction index START begins at; set to the resume PC on PAUSED"),
    Register("CP_ID", 0x20, "ro", "id of the cancellation point the core paused at"),
    Register("ERROR_CODE", 0x24, "ro", "ErrorCode of the last error (0 if none)"),
    Register("ERROR_PC", 0x28, "ro", "instruction index that raised the error"),
    Register("TIMEOUT", 0x2C, "rw", "cycle limit of a run (0: none); exceeding it raises TIMEOUT"),
    Register("RING_BASE", 0x30, "rw", "DRAM byte address of the command ring (32-byte aligned)"),
    Register("RING_SIZE", 0x34, "rw", "ring bytes: a power of two >= 32 (0: no ring, run from PROGRAM_BASE)"),
    Register("RING_TAIL", 0x38, "rw", "doorbell: count of instructions the host has appended to the ring"),
    Register("RING_HEAD", 0x3C, "ro", "instructions of the ring dispatched (the next one's count)"),
    Register("CYCLES", 0x40, "ro", "cycles since START", wide=True),
    Register("BUSY_LOAD", 0x48, "ro", "cycles the load unit was executing", wide=True),
    Register("BUSY_MATRIX", 0x50, "ro", "cycles the matrix unit was executing", wide=True),
    Register("BUSY_VECTOR", 0x58, "ro", "cycles the vector unit was executing", wide=True),
    Register("BUSY_STORE", 0x60, "ro", "cycles the store unit was executing", wide=True),
    Register("STALL_DISPATCH", 0x68, "ro", "cycles dispatch waited for a queue slot or a drain", wide=True),
    Register("DMA_RD_BYTES", 0x70, "ro", "data bytes read from DRAM by LOAD", wide=True),
    Register("DMA_WR_BYTES", 0x78, "ro", "data bytes written to DRAM by STORE", wide=True),
    Register("INSTRET", 0x80, "ro", "instructions dispatched since START", wide=True),
    Register("FENCE_COUNT", 0x88, "ro", "FENCE instructions completed since the last soft reset"),
    Register("DRAM_BASE", 0x8C, "rw", "memory window: the lowest DRAM byte a run may fetch, LOAD or STORE"),
    Register("DRAM_LIMIT", 0x90, "rw", "memory window: the first DRAM byte above it (0: no upper limit)"),
    Register("FAULT_ADDR", 0x94, "ro", "PROTECTION: the DRAM address of the access outside the window"),
    *(
        Register(
            f"RESUME_TOKENS{i}",
            0x98 + 4 * i,
            "rw",
            f"token counts of channels {4 * i}..{4 * i + 3} (a byte each, `TOKEN_CHANNELS` order): START "
            "loads them into the channels and clears them; set to the channels' counts on PAUSED",
        )
        for i in range(3)
    ),
)

REG = {r.name: r for r in REGISTERS}

#: The dependency-token channels as (producer, consumer) unit indices (npu.isa.Unit), in the order
#: of the hardware's vectors and of the RESUME_TOKENS bytes: every ordered pair of distinct units.
TOKEN_CHANNELS: tuple[tuple[int, int], ...] = tuple((p, c) for p in range(4) for c in range(4) if p != c)
RESUME_TOKEN_REGS = tuple(f"RESUME_TOKENS{i}" for i in range(3))


def pack_tokens(counts: dict[tuple[int, int], int]) -> list[int]:
    """The RESUME_TOKENS words holding channel counts {(producer, consumer): count} (0..255)."""
    words = [0, 0, 0]
    for k, ch in enumerate(TOKEN_CHANNELS):
        n = counts.get(ch, 0)
        if not 0 <= n <= 255:
            raise ValueError(f"token count {n} of channel {ch} is outside 0..255")
        words[k // 4] |= n << (8 * (k % 4))
    return words


def unpack_tokens(words: list[int]) -> dict[tuple[int, int], int]:
    """The nonzero channel counts held in RESUME_TOKENS words (the inverse of `pack_tokens`)."""
    out = {}
    for k, ch in enumerate(TOKEN_CHANNELS):
        n = words[k // 4] >> (8 * (k % 4)) & 0xFF
        if n:
            out[ch] = n
    return out
BY_OFFSET = {r.offset: r for r in REGISTERS}
COUNTERS = tuple(r.name for r in REGISTERS if r.wide)
#: Bytes of the register window (next power of two above the last register).
WINDOW_BYTES = 0x100


def offset(name: str) -> int:
    try:
        return REG[name].offset
    except KeyError:
        raise KeyError(f"no register {name!r}; registers: {', '.join(REG)}") from None


# ---- the SoC (hdl/soc.py): a SoC block, then one engine window per engine ---------------------------

SOC_MAGIC = 0x5355504E  # "NPUS" little-endian
#: Address bits of the SoC's AXI4-Lite port (4 KiB: the SoC block and up to 15 engine windows).
SOC_ADDR_BITS = 12
MAX_ENGINES = (1 << SOC_ADDR_BITS) // WINDOW_BYTES - 1

SOC_REGISTERS: tuple[Register, ...] = (
    Register("SOC_ID", 0x00, "ro", f"magic 0x{SOC_MAGIC:08x} ('NPUS')"),
    Register("SOC_VERSION", 0x04, "ro", "ISA version of every engine"),
    Register("SOC_CONFIG_ID", 0x08, "ro", "configuration id of the SoC (with its engine count)"),
    Register("ENGINES", 0x0C, "ro", "number of engines; engine i's registers are at 0x100 * (i + 1)"),
    Register("IRQ_STATUS", 0x10, "ro", "bit i: engine i's interrupt line (its IRQ.PENDING and IRQ_ENABLE)"),
    Register("IRQ_MASK", 0x14, "rw", "bit i: engine i drives the combined interrupt (reset: all ones)"),
)
SOC_REG = {r.name: r for r in SOC_REGISTERS}


def engine_window(i: int) -> int:
    """Byte offset of engine `i`'s register window on the SoC's AXI4-Lite port."""
    return WINDOW_BYTES * (i + 1)


def window_of(offset: int) -> tuple[int, int]:
    """The inverse of `engine_window`: (engine index, offset within its window) of a SoC register
    offset; engine -1 is the SoC block."""
    k, rel = divmod(offset, WINDOW_BYTES)
    return k - 1, rel

"""The micro core's memory map, as its control processor (and firmware) sees it. The firmware's
`isa.h` is generated from this module (`python -m npu.hdl.micro.firmware`), so it is defined once.

| CPU address | what |
|---|---|
| `ROM_BASE` (0x0000_0000) | the boot loader, block RAM initialised by the bitstream, read-only |
| `RAM_BASE` (0x0001_0000) | the firmware (code, data, stack): the top `RAM_BYTES` of the on-chip SPRAM |
| `ONCHIP_BASE` + a (0x1000_0000) | ISA on-chip address a: scratchpad, accumulators (0x80000...) |
| `DRAM_BASE` + a (0x2000_0000) | DRAM byte a through the AXI4 master, one beat per access |
| `REGS_BASE` + off (0x3000_0000) | the host's register window (firmware writes what the host reads) |
| `MMIO_BASE` (0x3000_0100) | the core's own registers, below |
"""

from npu.config import MICRO_MAC_COLUMNS, MICRO_MAC_MAX_WORDS

ROM_BASE = 0x0000_0000
#: the boot loader's block RAM (`boot.c`): it copies the firmware from the SPI flash into RAM
BOOT_BYTES = 1024
RAM_BASE = 0x0001_0000
RAM_BYTES = 24 * 1024
#: the firmware image in the board's SPI flash (past the bitstream): FIRMWARE_MAGIC, its length in
#: bytes, the sum of its 32-bit words (mod 2^32), a zero word, then the image (`firmware.bin`)
FLASH_FIRMWARE = 0x10_0000
FIRMWARE_MAGIC = 0x4655504E  # "NPUF"
#: the most bytes of firmware image (code and constants): the rest of RAM is its data and stack
FIRMWARE_LIMIT = 16 * 1024
#: the deepest unit queue the firmware holds (queue_depth; each entry keeps its decoded fields)
QUEUE_LIMIT = 8
ONCHIP_BASE = 0x1000_0000
DRAM_BASE = 0x2000_0000
REGS_BASE = 0x3000_0000
MMIO_BASE = 0x3000_0100

#: on-chip SPRAM: two SB_SPRAM256KA side by side, 16K words of 32 bits
ONCHIP_WORDS = 16 * 1024

# MMIO registers (byte offsets from MMIO_BASE)
#: read: host events and levels (EV_*); write: actions (ACT_*)
MMIO_EVENTS = 0x00
EV_START = 1 << 0  # the host wrote CONTROL with START (sticky until ACT_CLEAR_START)
EV_PAUSE = 1 << 1  # CONTROL.PAUSE as the host last wrote it (cleared by ACT_CONSUME_PAUSE)
EV_TIMEOUT = 1 << 2  # TIMEOUT is non-zero and the cycle counter reached it
EV_BUS_FAULT = 1 << 3  # a DRAM access was answered with an error (sticky until ACT_CLEAR_FAULT)
ACT_CLEAR_START = 1 << 0
ACT_CONSUME_PAUSE = 1 << 1
ACT_RAISE_IRQ = 1 << 2
ACT_CLEAR_FAULT = 1 << 3
ACT_COUNT = 1 << 4  # the cycle counter runs from now (cleared first)
ACT_STOP_COUNT = 1 << 5  # the cycle counter stops (and keeps its value)
#: the cycle counter (64 bits; reading LO latches HI)
MMIO_CYCLES_LO = 0x04
MMIO_CYCLES_HI = 0x08
#: write: the pause target the firmware chose (bit 31 set; bits 0..29: the most cancellation points
#: a unit had passed; bit 30: the target is the point after those, else it is the last one passed),
#: or 0 when the run stops; simulation benches read it (the latch of NpuCore)
MMIO_PAUSE_PROBE = 0x0C
#: write: the RING_TAIL at which the firmware found the ring empty, before it writes STATUS =
#: WAITING; the host then reads WAITING only while RING_TAIL is still that (a doorbell ends it at once)
MMIO_WAIT_TAIL = 0x10
#: the SPI flash's pins, bit-banged by the boot loader: write bit 0 CS_N, bit 1 SCK, bit 2 COPI;
#: read bit 0 CIPO
MMIO_SPI = 0x14
#: bit 0: the firmware in RAM is the flash's, checked (the boot loader writes 1 once it is); a power-up
#: or the board's reset clears it, SOFT_RESET does not (a soft reset restarts the firmware at once)
MMIO_BOOT = 0x18
#: the MAC array (hdl/micro/mac.py). MAC_STAGE (write) copies a B row into a staged column: SPRAM
#: word in bits 0..13, the number of words in bits 14..22 (at most MAC_MAX_WORDS, or half that with
#: MAC_STAGE_I16), the column (0..MAC_COLUMNS-1) in bits 23..24, MAC_STAGE_I16 to stage it for runs on
#: int16 A (a word takes two entries). MAC_RUN (write) runs an A row against the staged columns: SPRAM
#: word in bits 0..13, its words in bits 14..22, the mode (MAC_MODE_*) in bits 23..24, in bits
#: 25..26 how many bytes of its last word are A's (0: all four; the others count as zeros). Both writes
#: complete when the array is done; MAC_SUM0 + 4 c (read) is then column c's dot product less
#: MAC_OFFSET_I8 a word run (MAC_OFFSET_LO with MAC_MODE_LO), as a signed 32-bit number
MMIO_MAC_STAGE = 0x60
MMIO_MAC_RUN = 0x64
MMIO_MAC_SUM0 = 0x68
MAC_COLUMNS = MICRO_MAC_COLUMNS
MAC_MAX_WORDS = MICRO_MAC_MAX_WORDS
MAC_COUNT_SHIFT = 14
MAC_SEL_SHIFT = 23
MAC_STAGE_I16 = 1 << 25
MAC_TAIL_SHIFT = 25
#: a run's mode: int8 A; int16 A's high bytes; int16 A's low bytes (its result is then the low
#: bytes' products, as unsigned bytes); an int16 dot product is 256 HI + LO
MAC_MODE_I8 = 0
MAC_MODE_HI = 1
MAC_MODE_LO = 2
MAC_OFFSET_I8 = 512
MAC_OFFSET_LO = 256
#: read-only configuration words, in this order from MMIO_CONFIG
MMIO_CONFIG = 0x20
CONFIG_WORDS = ("spad_bytes", "acc_bytes", "dram_bytes", "lanes", "acc_row_bytes", "queue_depth",
                "token_depth", "config_id", "bus_bytes")  # fmt: skip

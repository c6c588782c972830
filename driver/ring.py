"""The host side of the command ring (docs/isa.md, "The command ring"): the ring's registers and
the appending of instructions, over any transport.

Counts are absolute: RING_TAIL is the number of instructions the host has appended since the ring
began (mod 2^32), RING_HEAD the number the core has dispatched; instruction k lives at
RING_BASE + 32 * (k mod slots). The host may append while the core runs; it writes the
instructions first and the doorbell (RING_TAIL) last.

When may a slot be written again? A dispatched instruction has been read, but a pause drops the
instructions dispatched after its cancellation point and the core fetches them again on resume. So
with pauses possible (`reuse="fence"`, the default) a slot is reused only once a FENCE after it has
completed (everything before a completed fence is done) or the ring is empty (WAITING); without
pauses (`reuse="dispatched"`) as soon as it is dispatched.
"""

from __future__ import annotations

from npu.errors import NpuError
from npu.isa import INSTR_BYTES, Opcode
from npu.registers import Control, Status

from .transport import Transport

MASK = 0xFFFFFFFF


class RingError(NpuError, RuntimeError):
    pass


class Ring:
    """A ring of `size` bytes (a power of two >= 32) at DRAM `base` on the core behind `tr`."""

    def __init__(self, tr: Transport, base: int, size: int, *, reuse: str = "fence"):
        if size < INSTR_BYTES or size & (size - 1):
            raise RingError(f"ring size {size} is not a power of two >= {INSTR_BYTES} bytes")
        if base % INSTR_BYTES:
            raise RingError(f"ring base 0x{base:x} is not {INSTR_BYTES}-byte aligned")
        if reuse not in ("fence", "dispatched"):
            raise RingError(f"reuse must be 'fence' or 'dispatched', got {reuse!r}")
        self.tr, self.base, self.size, self.reuse = tr, base, size, reuse
        self.slots = size // INSTR_BYTES
        self.tail = 0
        self.fences: list[int] = []  # count after each appended FENCE whose completion is not seen
        self.fence_base = 0  # FENCE_COUNT when the ring began
        self.fences_seen = 0
        self.done = 0  # every instruction before this count is complete

    def start(self, pc: int = 0, window: tuple[int, int] = (0, 0)) -> None:
        """Point the core at the ring (empty, counts from `pc`) and start it: it waits for appends.
        `window`: the memory window (DRAM_BASE, DRAM_LIMIT) of the whole ring run; (0, 0), none: a
        ring interleaves several models' layers, so one window cannot follow them one by one (their
        containers were checked at load)."""
        self.tail = self.done = pc & MASK
        self.fences, self.fences_seen = [], 0
        self.fence_base = self.tr.reg("FENCE_COUNT")
        self.tr.set_reg("RING_BASE", self.base)
        self.tr.set_reg("RING_SIZE", self.size)
        self.tr.set_reg("RING_TAIL", self.tail)
        self.tr.set_reg("RESUME_PC", self.tail)
        self.tr.set_resume_tokens([0, 0, 0])  # a new run: no paused program's tokens
        self.tr.set_reg("DRAM_BASE", window[0])
        self.tr.set_reg("DRAM_LIMIT", window[1])
        ctl = self.tr.reg("CONTROL") & int(Control.IRQ_ENABLE)
        self.tr.set_reg("CONTROL", ctl | int(Control.START))

    def stop_using(self) -> None:
        """Back to programs at PROGRAM_BASE (the core must be stopped)."""
        if self.tr.status() in (Status.RUNNING, Status.WAITING):
            raise RingError("the core still runs from the ring; pause or reset it first")
        self.tr.set_reg("RING_SIZE", 0)

    @property
    def head(self) -> int:
        return self.tr.reg("RING_HEAD")

    def completed(self) -> int:
        """The count below which every instruction of the ring is complete (as far as seen)."""
        if self.tr.status() == Status.WAITING:
            self.fences.clear()
            self.done = self.tail
            return self.done
        n = (self.tr.reg("FENCE_COUNT") - self.fence_base) & MASK
        while self.fences and self.fences_seen < n:
            self.done = self.fences.pop(0)
            self.fences_seen += 1
        return self.done

    def free(self) -> int:
        """Slots the host may fill now."""
        used_from = self.head if self.reuse == "dispatched" else self.completed()
        return self.slots - ((self.tail - used_from) & MASK)

    def append(self, program: bytes, *, partial: bool = False) -> int:
        """Write instructions (a multiple of 32 bytes) after the tail and ring the doorbell.
        Returns how many were appended: all of them, or (with `partial`) as many as fit now."""
        if len(program) % INSTR_BYTES:
            raise RingError(f"{len(program)} bytes is not a whole number of instructions")
        n = len(program) // INSTR_BYTES
        room = self.free()
        if n > room and not partial:
            raise RingError(f"{n} instructions do not fit: {room} of {self.slots} slots are free")
        n = min(n, room)
        for i in range(n):  # remember where the fences are: they free the slots before them
            if program[i * INSTR_BYTES] & 0xF == Opcode.FENCE:
                self.fences.append((self.tail + i + 1) & MASK)
        for addr, k, m in self._pieces(self.tail, n):
            self.tr.write_dram(addr, program[k * INSTR_BYTES : (k + m) * INSTR_BYTES])
        self.tail = (self.tail + n) & MASK
        if n:
            self.tr.set_reg("RING_TAIL", self.tail)
        return n

    def rewind(self, count: int) -> bytes:
        """Take back the instructions from `count` to the tail (the core must be stopped, e.g. PAUSED
        with RESUME_PC = `count`): returns them and makes `count` the tail, so the host can append
        something else first and then these again (preemption inside the ring)."""
        if self.tr.status() in (Status.RUNNING, Status.WAITING):
            raise RingError("the core still runs from the ring; pause it first")
        n = (self.tail - count) & MASK
        if n > self.slots:
            raise RingError(f"count {count} is not between the completed part and the tail {self.tail}")
        out = b"".join(self.tr.read_dram(addr, m * INSTR_BYTES) for addr, _, m in self._pieces(count, n))
        self.tail = count & MASK
        self.fences = [f for f in self.fences if ((f - 1 - count) & MASK) >= n]  # fences before count
        return out

    def _pieces(self, count: int, n: int):
        """The `n` slots from `count` on as (DRAM address, offset, length) in at most two pieces: up to
        the end of the ring, then from its start."""
        k = 0
        while k < n:
            slot = (count + k) % self.slots
            m = min(n - k, self.slots - slot)
            yield self.base + slot * INSTR_BYTES, k, m
            k += m

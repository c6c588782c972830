"""Small building blocks shared by the units: instruction views, memory address maps, byte FIFO."""

from __future__ import annotations

import operator

from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu.config import ACC_BASE, NpuConfig
from npu.isa import INSTR_BITS, ErrorCode, Opcode, struct_layout

#: one AXI burst request: byte address and AxLEN (beats - 1)
Burst = data.StructLayout({"addr": 32, "len": 8})
#: one fetched instruction and its pc; `bad` marks a pc outside DRAM (no instruction), `fault` a
#: fetch the memory answered with an error, `code` the instruction's check result (hdl/checks.py)
Fetched = data.StructLayout({"instr": INSTR_BITS, "pc": 32, "bad": 1, "fault": 1, "code": ErrorCode})


#: an entry of a unit's instruction queue: the instruction, its pc, and the ordinal of the next
#: cancellation point (a marker's own ordinal)
QueueEntry = data.StructLayout({"instr": INSTR_BITS, "pc": 32, "ordinal": 16})
#: the 16-bit header every instruction starts with (docs/isa.md)
Header = data.StructLayout({"opcode": Opcode, "wait": 4, "signal": 4, "rsvd": 4})


def header(word) -> data.View:
    """The header of an instruction word: opcode (an `Opcode`-shaped view), wait and signal masks."""
    return data.View(Header, word[: Header.size])


def exec_signature() -> wiring.Signature:
    """A unit's instruction port, seen from the dispatcher: `go` starts `instr` (only while the unit
    is not `busy`); `done` pulses when the instruction has completed (its tokens may be pushed)."""
    return wiring.Signature({"go": Out(1), "instr": Out(INSTR_BITS), "busy": In(1), "done": In(1)})


def burst_stream() -> stream.Signature:
    return stream.Signature(Burst)


def beat_stream(cfg: NpuConfig) -> stream.Signature:
    """Read data beats of `bus_bytes`."""
    return stream.Signature(unsigned(8 * cfg.bus_bytes))


def write_beat_stream(cfg: NpuConfig) -> stream.Signature:
    W = cfg.bus_bytes
    return stream.Signature(data.StructLayout({"data": 8 * W, "strb": W, "last": 1}))


def view(op: Opcode, word) -> data.View:
    """The instruction word seen through `op`'s field layout (the single ISA definition)."""
    return data.View(struct_layout(op), word)


def log2(x: int) -> int:
    assert x > 0 and x & (x - 1) == 0, x
    return x.bit_length() - 1


def is_acc(addr) -> object:
    """True when an on-chip byte address is in the accumulator window."""
    return addr >= ACC_BASE


def word_index(addr, cfg: NpuConfig, mem: str):
    """Word index of an on-chip byte address inside `mem` ("spad" or "acc")."""
    off = addr - ACC_BASE if mem == "acc" else addr
    return off[log2(cfg.bus_bytes) :]


def min_(a, b):
    return Mux(a < b, a, b)


def tree(values: list, op=operator.add):
    """`values` combined by `op` as a balanced tree (Python's `sum` chains them: depth n - 1)."""
    while len(values) > 1:
        pairs = range(0, len(values), 2)
        values = [op(values[i], values[i + 1]) if i + 1 < len(values) else values[i] for i in pairs]
    return values[0]


def times(k: int, value):
    """`k * value` for a constant `k`: shifted copies added, so that no synthesis tool takes a
    DSP block for it (Yosys maps a product by a constant of two or more bits to one)."""
    terms = [value << b for b in range(k.bit_length()) if k >> b & 1]
    return tree(terms) if terms else Const(0)


def shift_add(small, big, width: int):
    """`small * big` modulo 2**width for an unsigned `small` of a few bits: a tree of shifted adds
    over its bits, logic and not a DSP block, for products taken once an instruction where the
    multipliers are the MACs' (docs/boards.md)."""
    assert not small.shape().signed, "shift_add takes an unsigned multiplier"
    return tree([Mux(small[i], big << i, 0) for i in range(len(small))])[:width]


def follow(m: Module, value, enables: list, name: str) -> Signal:
    """`value` registered along a pipeline: one register per stage, loaded when its enable (the
    stage taking the step) is high. Returns the last stage's register, which holds the value of
    the step that stage holds."""
    for s, en in enumerate(enables):
        reg = Signal(len(value), name=f"{name}_{s}")
        with m.If(en):
            m.d.sync += reg.eq(value)
        value = reg
    return value


def low_bytes_mask(n, width_bytes: int, subtract: bool = False):
    """Byte-enable mask with the low `n` bits set (n in 0..width_bytes): bit k is n > k, a compare
    with a constant each (a LUT for a bus's byte count), not a shift and a carry chain (Fmax); or,
    with `subtract`, 2**n - 1, which Yosys maps smaller in some contexts (the store's byte FIFO)."""
    if subtract:
        return ((Const(1, width_bytes + 1) << n) - 1)[:width_bytes]
    return Cat(*[n > k for k in range(width_bytes)])


def burst_plan(m: Module, addr, left, W: int, name: str) -> tuple[Signal, Signal, Signal]:
    """The AXI burst at byte address `addr` with `left` bytes of the row still to move over a bus
    of `W` bytes: (beats, bytes it covers from `addr` - only when it does not end the row, the only
    case they are used -, whether it ends the row). Bursts stop at 256 beats and at 4 KiB
    boundaries. The row ends with this burst exactly when its beats to the row's end fit under both
    limits, so that compares in parallel with the limits instead of after their minimum and a
    subtraction; and the bytes of a burst that does not end the row are the limit's (Fmax)."""
    lw = log2(W)
    beats_row = Signal(18 - lw, name=f"{name}_beats_row")
    to_4k = Signal(range((4096 >> lw) + 1), name=f"{name}_to_4k")
    limit = Signal(9, name=f"{name}_limit")
    beats = Signal(9, name=f"{name}_beats")
    nbytes = Signal(18, name=f"{name}_bytes")
    last = Signal(name=f"{name}_row_end")
    m.d.comb += [
        beats_row.eq((addr[:lw] + left + W - 1) >> lw),
        to_4k.eq((4096 >> lw) - addr[lw:12]),
        limit.eq(min_(to_4k, 256)),
        last.eq((beats_row <= 256) & (beats_row <= to_4k)),
        beats.eq(Mux(last, beats_row, limit)),
        nbytes.eq((limit << lw) - addr[:lw]),
    ]
    return beats, nbytes, last


class ByteFifo(wiring.Component):
    """A byte queue: push up to W bytes per cycle, look at / pop up to W bytes per cycle.

    Used to realign DMA data between DRAM beats and on-chip words. `data` holds the oldest bytes
    (byte 0 first; bytes past `count` are unspecified); `count` how many are valid. Push is accepted
    when `push_ready` (room for W). It holds `cap_words` words.

    A ring of `cap` bytes with read and write pointers rather than a shift register: `data` (the
    ring rotated by the read pointer) and `count` come from registers alone, so the consumer's
    `pop_n` only moves a pointer and never runs through a shifter into the queue (Fmax); a push
    writes its bytes rotated to the write pointer under a byte mask.

    With `prerotated`, the producer gives the rotation itself (`push_rot`, registered the cycle
    before from `wptr_next`): push_data's byte j goes to ring byte (j + push_rot) mod cap, so a
    producer whose first byte is at an offset into its word folds its own shift into the ring's
    rotation, one shifter instead of two between a block RAM and the ring (Fmax).
    """

    def __init__(self, width_bytes: int, cap_words: int = 2, prerotated: bool = False):
        self.W = width_bytes
        self.cap = cap_words * width_bytes
        self.prerotated = prerotated
        members = {
            "push_valid": In(1),
            "push_data": In(8 * width_bytes),
            "push_n": In(range(width_bytes + 1)),
            "push_ready": Out(1),
            "pop_n": In(range(width_bytes + 1)),
            "data": Out(8 * width_bytes),
            "count": Out(range(self.cap + 1)),
        }
        if prerotated:
            members["push_rot"] = In(range(self.cap))
            members["wptr_next"] = Out(range(self.cap))  # the write pointer after this cycle
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        W, S = self.W, self.cap
        ring = Signal(8 * S)
        rptr = Signal(range(S))
        wptr = Signal(range(S))
        m.d.comb += self.push_ready.eq(self.count + W <= S)
        # the oldest W bytes: the ring read from rptr on, wrapping
        m.d.comb += self.data.eq((Cat(ring, ring) >> (rptr * 8))[: 8 * W])
        push = self.push_valid & self.push_ready
        n_in = Mux(push, self.push_n, 0)
        # the pushed bytes rotated to wptr (the part past the end wraps)
        dd = Signal(16 * S)
        rot = self.push_rot if self.prerotated else wptr
        m.d.comb += dd.eq(self.push_data << (rot * 8))
        # the byte mask from push_n alone, rotated to wptr; the handshake gates only the result, so
        # the producer's valid (an AXI channel's, from across the part) skips that logic (Fmax).
        # Its low push_n bits as compares (the load's: no carry chain on its critical path) or, in
        # the store's prerotated ring, as 2**n - 1, which Yosys maps to 1,500 fewer LUT4 there
        # (docs/boards.md)
        t = Cat(low_bytes_mask(self.push_n, W, subtract=self.prerotated), Const(0, S - W))
        mask = (Cat(t, t) << wptr)[S : 2 * S] & push.replicate(S)
        bits = Cat(*[mask[k].replicate(8) for k in range(S)])
        m.d.sync += ring.eq((ring & ~bits) | ((dd[: 8 * S] | dd[8 * S :]) & bits))

        def advance(ptr, n):
            nxt = ptr + n
            return Mux(nxt >= S, nxt - S, nxt) if S & (S - 1) else nxt[: len(ptr)]

        wnext = Signal(range(S))
        m.d.comb += wnext.eq(advance(wptr, n_in))
        if self.prerotated:
            m.d.comb += self.wptr_next.eq(wnext)
        m.d.sync += [
            rptr.eq(advance(rptr, self.pop_n)),
            wptr.eq(wnext),
            self.count.eq(self.count - self.pop_n + n_in),
        ]
        return m

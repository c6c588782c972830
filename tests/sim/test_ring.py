"""The command ring on the golden model: appends while the core runs, wrap-around, waits on an empty
ring, fences (completion counter and interrupt), pause and errors inside the ring."""

from __future__ import annotations

import random

import numpy as np
import pytest

from npu.config import get_config
from npu.driver.ring import Ring, RingError
from npu.driver.transport import ModelTransport
from npu.isa import INSTR_BYTES, ErrorCode, Opcode, encode, encode_program, make
from npu.registers import Status
from npu.sim.rtl.ring_scenarios import layers as _layers

CFG = get_config("tiny")
RING_BASE = 0x8000


def layers(seeds: list[int], cp_prob: float = 0.0):
    instrs, ref, out = _layers(CFG, seeds, cp_prob)
    want = np.zeros(CFG.dram_bytes, np.uint8)
    want[ref.out_base : ref.out_base + ref.out_bytes] = np.frombuffer(out, np.uint8)
    return instrs, ref, want


def device(ref) -> ModelTransport:
    tr = ModelTransport(CFG)
    for addr, arr in ref.dram.items():
        tr.write_dram(addr, arr.tobytes())
    return tr


def out(tr, ref) -> bytes:
    return tr.read_dram(ref.out_base, ref.out_bytes)


def test_appends_racing_the_core_with_wraparound_match_the_sequential_reference():
    instrs, ref, want = layers([1, 2, 3])
    blob = encode_program(instrs)
    tr = device(ref)
    ring = Ring(tr, RING_BASE, 8 * INSTR_BYTES, reuse="dispatched")  # 8 slots: wraps several times
    ring.start()
    rng = random.Random(5)
    k = 0
    while k < len(instrs):
        n = ring.append(blob[k * INSTR_BYTES : (k + rng.randint(1, 5)) * INSTR_BYTES], partial=True)
        k += n
        tr.model.advance(rng.choice([1, 3, 20, 200]))  # the host appends at random moments
    tr.model.run(None)
    assert tr.status() == Status.WAITING and ring.head == len(instrs)
    assert tr.reg("FENCE_COUNT") == 3
    assert out(tr, ref) == want[ref.out_base : ref.out_base + ref.out_bytes].tobytes()


def test_an_empty_ring_waits_and_continues_when_the_tail_moves():
    instrs, ref, want = layers([7, 8])
    tr = device(ref)
    ring = Ring(tr, RING_BASE, 64 * INSTR_BYTES)
    ring.start()
    assert tr.status() == Status.WAITING  # nothing appended yet
    t0 = tr.now()
    tr.wait(5000)
    assert tr.now() - t0 == 5000 and tr.status() == Status.WAITING  # time passes, no error
    ring.append(encode_program(instrs))
    t_doorbell = tr.now()
    assert tr.status() == Status.RUNNING
    tr.wait(None)
    assert tr.status() == Status.RUNNING  # stopped at the first fence's interrupt, still running
    assert tr.reg("FENCE_COUNT") == 1 and tr.reg("IRQ") == 1
    tr.wait(None)
    assert tr.reg("FENCE_COUNT") == 2 and tr.status() == Status.WAITING
    assert tr.reg("CYCLES") > tr.now() - t_doorbell  # counts the wait before the doorbell too
    assert out(tr, ref) == want[ref.out_base : ref.out_base + ref.out_bytes].tobytes()


def test_each_fence_stops_a_wait_and_counts_once_every_earlier_instruction_is_done():
    instrs, ref, _ = layers([11, 12, 13, 14])
    tr = device(ref)
    tr.model.trace = []
    ring = Ring(tr, RING_BASE, 128 * INSTR_BYTES)
    ring.start()
    ring.append(encode_program(instrs))
    fences = []
    while tr.status() == Status.RUNNING:
        tr.wait(None)
        fences.append((tr.reg("FENCE_COUNT"), tr.now()))
        tr.set_reg("IRQ", 1)
    assert [f for f, _ in fences[:4]] == [1, 2, 3, 4]
    ends = [e.end for e in tr.model.trace if e.unit in ("load", "matrix", "vector", "store")]
    fence_times = [e.start for e in tr.model.trace if e.op == "fence"]
    assert len(fence_times) == 4 and max(ends) <= fence_times[-1]


def test_pause_inside_the_ring_resumes_bit_exact():
    instrs, ref, want = layers([21, 22], cp_prob=0.3)
    assert any(i.op == Opcode.CANCEL_POINT for i in instrs)
    tr = device(ref)
    ring = Ring(tr, RING_BASE, 32 * INSTR_BYTES)  # a layer fits; slots are reused after its fence
    ring.start()
    blob = encode_program(instrs)
    k = ring.append(blob, partial=True)
    tr.model.advance(30)
    tr.model.request_pause()
    pauses = 0
    for _ in range(10_000):
        st = tr.status()
        assert st != Status.ERROR, ErrorCode(tr.reg("ERROR_CODE"))
        if st == Status.PAUSED:
            pauses += 1
            assert ring.head == tr.reg("RESUME_PC")  # the ring resumes right after the point
            tr.model.start()
        elif st == Status.WAITING and k == len(instrs):
            break
        k += ring.append(blob[k * INSTR_BYTES :], partial=True)
        tr.wait(50)
    assert pauses == 1
    assert out(tr, ref) == want[ref.out_base : ref.out_base + ref.out_bytes].tobytes()


def test_errors_inside_the_ring():
    tr = ModelTransport(CFG)
    ring = Ring(tr, RING_BASE, 4 * INSTR_BYTES)
    ring.start(pc=100)  # counts need not start at 0
    bad = bytearray(encode(make(Opcode.BARRIER)))
    bad[0] = 0x0F  # an opcode that does not exist
    ring.append(encode(make(Opcode.BARRIER)) + bytes(bad))
    tr.wait(None)
    assert tr.status() == Status.ERROR
    assert tr.reg("ERROR_CODE") == ErrorCode.ILLEGAL_OPCODE and tr.reg("ERROR_PC") == 101

    tr.set_reg("CONTROL", 4)  # soft reset turns the ring off
    assert tr.reg("RING_SIZE") == 0
    tr.set_reg("RING_BASE", RING_BASE)
    tr.set_reg("RING_SIZE", 3 * INSTR_BYTES)  # not a power of two
    tr.set_reg("RING_TAIL", 1)
    tr.set_reg("CONTROL", 1)
    tr.wait(None)
    assert tr.status() == Status.ERROR and tr.reg("ERROR_CODE") == ErrorCode.DRAM_RANGE


def test_a_fence_reports_completion_without_holding_back_later_work():
    """Layer A (a long matmul) then FENCE then layer B (independent: other memory): B's load runs
    under A's matmul, and the fence completes when A's last instruction (its store) is done."""
    W = CFG.bus_bytes
    k = 64 * CFG.lanes
    a = [
        make("load", spad=0, dram=0x1000, rows=CFG.clusters, cols=k, spad_stride=k, dram_stride=k),
        make("load", spad=4096, dram=0x1000, rows=CFG.pes_per_cluster, cols=k, spad_stride=k, dram_stride=k),
        make("matmul", a=0, b=4096, c=0x80000, m=CFG.clusters, n=CFG.pes_per_cluster, k=k, a_stride=k,
             b_stride=k, c_stride=CFG.acc_row_bytes),
        make("store", spad=0x80000, dram=0x3000, rows=1, cols=16, spad_stride=16, dram_stride=16),
    ]  # fmt: skip
    b = [make("load", spad=12288, dram=0x2000, rows=1, cols=8 * W, spad_stride=8 * W, dram_stride=8 * W)]
    from npu.program import ProgramBuilder

    pb = ProgramBuilder(CFG)
    for ins in a:
        pb.add(ins)
    pb.fence()
    for ins in b:
        pb.add(ins)
    prog = pb.build(end=False).instrs
    tr = ModelTransport(CFG)
    tr.model.trace = []
    ring = Ring(tr, RING_BASE, 16 * INSTR_BYTES)
    ring.start()
    ring.append(encode_program(prog))
    tr.wait(None)
    assert tr.reg("FENCE_COUNT") == 1
    ev = {(e.unit, e.op): e for e in tr.model.trace}
    mm, st, ld_b = ev[("matrix", "matmul")], ev[("store", "store")], [
        e for e in tr.model.trace if e.op == "load" and e.pc == len(a) + 1][0]  # fmt: skip
    assert ld_b.start < mm.end  # B's load overlaps A's compute
    fence = ev[("control", "fence")]
    assert fence.start >= st.end  # the fence completed after A's last instruction


def test_timeout_while_the_ring_waits():
    tr = ModelTransport(CFG)
    tr.set_reg("TIMEOUT", 1000)
    Ring(tr, RING_BASE, 4 * INSTR_BYTES).start()
    tr.wait(5000)
    assert tr.status() == Status.ERROR and tr.reg("ERROR_CODE") == ErrorCode.TIMEOUT


def test_ring_host_errors():
    tr = ModelTransport(CFG)
    with pytest.raises(RingError, match="power of two"):
        Ring(tr, RING_BASE, 96)
    ring = Ring(tr, RING_BASE, 2 * INSTR_BYTES)
    ring.start()
    tr.model.advance(10)
    with pytest.raises(RingError, match="3 instructions do not fit: 2 of 2 slots are free"):
        ring.append(bytes(3 * INSTR_BYTES))
    with pytest.raises(RingError, match="still runs"):
        ring.stop_using()
    assert np.all(np.frombuffer(tr.read_dram(RING_BASE, 64), np.uint8) == 0)


@pytest.mark.parametrize("start", [0, 50])  # 50: the counts wrap around the 64 slots
def test_rewind_takes_back_what_follows_a_pause_and_the_run_ends_as_before(start):
    """Preemption inside the ring: at a pause the host takes back the instructions after the point
    (`Ring.rewind`), may append other work first, then appends them again; the result is unchanged."""
    instrs, ref, want = layers([31, 32], cp_prob=0.3)
    tr = device(ref)
    ring = Ring(tr, RING_BASE, 64 * INSTR_BYTES)
    ring.start(start)
    blob = encode_program(instrs)
    assert ring.append(blob) == len(instrs)
    with pytest.raises(RingError, match="pause it first"):
        ring.rewind(start)
    tr.model.advance(30)
    tr.model.request_pause()
    tr.model.run(None)
    assert tr.status() == Status.PAUSED
    p = tr.reg("RESUME_PC")
    rest = ring.rewind(p)
    assert rest == blob[(p - start) * INSTR_BYTES :] and ring.tail == p
    assert 0 < len(rest) < len(blob)  # the pause fell inside the program
    # only the fences before the point are still awaited
    assert all(((f - 1 - p) & 0xFFFFFFFF) >= len(rest) // INSTR_BYTES for f in ring.fences)
    assert ring.append(rest) == len(rest) // INSTR_BYTES
    tr.model.start()
    while tr.status() == Status.RUNNING:
        tr.wait(None)
    assert tr.status() == Status.WAITING and ring.head == start + len(instrs)
    assert tr.reg("FENCE_COUNT") == 2
    assert out(tr, ref) == want[ref.out_base : ref.out_base + ref.out_bytes].tobytes()

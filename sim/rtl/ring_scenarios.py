"""Command-ring scenarios run through the driver's transport interface, so the same host code drives
the golden model and the RTL (`npu.sim.rtl.transport.run_on_rtl`): appends racing the fetcher with
wrap-around, waits on an empty ring, fences, pauses inside the ring and errors. Each returns a record
of what the host saw; the two backends must agree on everything but the cycle counts."""

from __future__ import annotations

import dataclasses
import hashlib
import random

from npu.config import NpuConfig
from npu.isa import INSTR_BYTES, Opcode, Unit, encode, encode_program, make
from npu.registers import Control, Status
from npu.sim.rtl.randprog import random_program, sequential_reference

RING_BASE = 0x8000
WAIT_STEP = 20_000  # host waits are bounded: a ring that runs dry raises no interrupt
#: the micro core's firmware takes about 25 times NpuCore's cycles an instruction: the racing host's
#: waits are scaled by it, so appends land at random moments of as many instructions on both cores
#: (unscaled, the host polled a full ring some 50,000 times a scenario through the RTL's bus)
MICRO_PACE = 25


def layers(cfg: NpuConfig, seeds: list[int], cp_prob: float = 0.0):
    """Random programs concatenated as layers, each ending in BARRIER + FENCE instead of END (the
    programs share buffers, so each must finish before the next starts; a FENCE alone does not
    order); the first one's set-up (initial DRAM, output window) and the sequential reference DRAM
    of the whole."""
    rps = [random_program(cfg, s, n_instrs=20, cp_prob=cp_prob) for s in seeds]
    instrs = []
    for rp in rps:
        assert rp.program.instrs[-1].op == Opcode.END
        instrs += rp.program.instrs[:-1] + [make(Opcode.BARRIER), make(Opcode.FENCE)]
    ref = rps[0]
    whole = dataclasses.replace(ref, program=dataclasses.replace(ref.program, instrs=instrs))
    dram, _ = sequential_reference(cfg, whole)
    return instrs, ref, dram[ref.out_base : ref.out_base + ref.out_bytes].tobytes()


def _record(tr, ref, t0: int, pauses: list) -> dict:
    out = tr.read_dram(ref.out_base, ref.out_bytes) if ref is not None else b""
    return {
        "status": Status(tr.reg("STATUS")).name,
        "error_code": tr.reg("ERROR_CODE"),
        "error_pc": tr.reg("ERROR_PC"),
        "fence_count": tr.reg("FENCE_COUNT"),
        "ring_head": tr.reg("RING_HEAD"),
        "pauses": pauses,
        "out_sha": hashlib.sha256(out).hexdigest()[:16],
        "cycles": tr.now() - t0,
    }


PROG = 0xF000  # where the clearing program runs from


def _clear_onchip(tr) -> None:
    """Zero the scratchpad and the accumulators (the reference starts from zeroed memories)."""
    from npu.sim.rtl.cocotb_bench import clear_program

    tr.write_dram(PROG, clear_program(tr.cfg))
    tr.set_reg("PROGRAM_BASE", PROG)
    tr.set_reg("RESUME_PC", 0)
    tr.set_reg("CONTROL", int(Control.IRQ_ENABLE | Control.START))
    for _ in range(100):
        if Status(tr.reg("STATUS")) != Status.RUNNING:
            break
        tr.wait(WAIT_STEP)
    assert Status(tr.reg("STATUS")) == Status.DONE, Status(tr.reg("STATUS"))


def _fresh(tr, ref=None) -> int:
    tr.set_reg("CONTROL", int(Control.SOFT_RESET))
    _clear_onchip(tr)
    tr.set_reg("CONTROL", int(Control.SOFT_RESET))
    tr.set_reg("CONTROL", int(Control.IRQ_ENABLE))
    if ref is not None:
        for addr, arr in ref.dram.items():
            tr.write_dram(addr, arr.tobytes())
        tr.write_dram(ref.out_base, bytes(ref.out_bytes))
    return tr.now()


def _settle(tr, fences: int, limit: int = 200) -> None:
    """Wait (clearing each interrupt) until `fences` fences completed and the ring is WAITING, or the
    core stopped."""
    for _ in range(limit):
        st = Status(tr.reg("STATUS"))
        if st not in (Status.RUNNING, Status.WAITING):
            return
        if st == Status.WAITING and tr.reg("FENCE_COUNT") >= fences:
            return
        tr.set_reg("IRQ", 1)
        tr.wait(WAIT_STEP)


def racing_appends(tr, seeds: list[int], slots: int, seed: int) -> dict:
    """Instructions appended a few at a time at random moments while the core runs, into a ring of
    `slots` slots (reused once dispatched: no pauses here)."""
    from npu.driver.ring import Ring

    instrs, ref, want = layers(tr.cfg, seeds)
    t0 = _fresh(tr, ref)
    ring = Ring(tr, RING_BASE, slots * INSTR_BYTES, reuse="dispatched")
    ring.start()
    blob, rng, k = encode_program(instrs), random.Random(seed), 0
    pace = MICRO_PACE if tr.cfg.core == "micro" else 1
    while k < len(instrs):
        k += ring.append(blob[k * INSTR_BYTES : (k + rng.randint(1, 6)) * INSTR_BYTES], partial=True)
        tr.set_reg("IRQ", 1)
        tr.wait(pace * rng.choice([1, 2, 5, 30, 200]))
    _settle(tr, len(seeds))
    rec = _record(tr, ref, t0, [])
    rec["match"] = tr.read_dram(ref.out_base, ref.out_bytes) == want
    return rec


def empty_ring_wait(tr, seeds: list[int]) -> dict:
    """A ring started empty waits (STATUS WAITING, time passes) until the doorbell, then runs."""
    from npu.driver.ring import Ring

    instrs, ref, want = layers(tr.cfg, seeds)
    t0 = _fresh(tr, ref)
    ring = Ring(tr, RING_BASE, 64 * INSTR_BYTES)
    ring.start()
    tr.wait(3000)
    before = Status(tr.reg("STATUS")).name
    ring.append(encode_program(instrs))
    _settle(tr, len(seeds))
    rec = _record(tr, ref, t0, [])
    rec["before"] = before
    rec["match"] = tr.read_dram(ref.out_base, ref.out_bytes) == want
    return rec


def counters_at_waiting(tr) -> dict:
    """The counters the host reads while the ring waits are up to date after the last thing the core
    did, even when that was a lone fence's or cancellation point's markers (which write none on the
    micro core until another step does): INSTRET and STALL_DISPATCH at each WAITING."""
    from npu.driver.ring import Ring

    _fresh(tr)
    ring = Ring(tr, RING_BASE, 16 * INSTR_BYTES)
    ring.start()
    seen = []
    for k, ins in enumerate([make(Opcode.SYNC, unit=int(Unit.LOAD)), make(Opcode.FENCE),
                             make(Opcode.CANCEL_POINT, id=7)]):  # fmt: skip
        ring.append(encode(ins))
        _settle(tr, 1 if k else 0)
        seen.append((Status(tr.reg("STATUS")).name, tr.reg("INSTRET"), tr.reg("FENCE_COUNT")))
    return {"seen": seen}


def pause_every_point(tr, seeds: list[int]) -> dict:
    """Every START (and the first) carries PAUSE: the core stops at each cancellation point of the
    ring; the host resumes it; slots are reused after fences (the ring is smaller than the work)."""
    from npu.driver.ring import Ring

    instrs, ref, want = layers(tr.cfg, seeds, cp_prob=0.3)
    t0 = _fresh(tr, ref)
    ring = Ring(tr, RING_BASE, 32 * INSTR_BYTES)
    tr.set_reg("CONTROL", int(Control.IRQ_ENABLE | Control.PAUSE))
    ring.start()
    tr.set_reg("CONTROL", int(Control.IRQ_ENABLE | Control.PAUSE))
    blob, k, pauses = encode_program(instrs), 0, []
    for _ in range(5000):
        k += ring.append(blob[k * INSTR_BYTES :], partial=True)
        st = Status(tr.reg("STATUS"))
        if st == Status.PAUSED:
            pauses.append((tr.reg("CP_ID"), tr.reg("RESUME_PC"), tr.reg("RING_HEAD")))
            tr.set_reg("IRQ", 1)
            tr.set_reg("CONTROL", int(Control.IRQ_ENABLE | Control.PAUSE | Control.START))
            continue
        if st not in (Status.RUNNING, Status.WAITING):
            break
        if st == Status.WAITING and k == len(instrs) and tr.reg("FENCE_COUNT") >= len(seeds):
            break
        tr.set_reg("IRQ", 1)
        tr.wait(500)
    rec = _record(tr, ref, t0, pauses)
    rec["match"] = tr.read_dram(ref.out_base, ref.out_bytes) == want
    rec["points"] = sum(1 for i in instrs if i.op == Opcode.CANCEL_POINT)
    return rec


def ring_errors(tr) -> list[dict]:
    """An illegal opcode inside the ring (counts starting at 100), a FENCE with a token bit set,
    and a ring whose size is not a power of two."""
    from npu.driver.ring import Ring

    recs = []
    t0 = _fresh(tr)
    ring = Ring(tr, RING_BASE, 4 * INSTR_BYTES)
    ring.start(pc=100)
    bad = bytearray(encode(make(Opcode.BARRIER)))
    bad[0] = 0x0F
    ring.append(encode(make(Opcode.BARRIER)) + bytes(bad))
    _settle(tr, 0)
    recs.append(_record(tr, None, t0, []))

    t0 = _fresh(tr)
    ring = Ring(tr, RING_BASE, 4 * INSTR_BYTES)
    ring.start()
    fence = bytearray(encode(make(Opcode.FENCE)))
    fence[0] |= 0x20  # a wait bit: control instructions carry no tokens
    ring.append(encode(make(Opcode.SYNC, unit=int(Unit.LOAD))) + bytes(fence))
    _settle(tr, 1)
    recs.append(_record(tr, None, t0, []))

    t0 = _fresh(tr)
    tr.set_reg("RING_BASE", RING_BASE)
    tr.set_reg("RING_SIZE", 3 * INSTR_BYTES)
    tr.set_reg("RING_TAIL", 1)
    tr.set_reg("CONTROL", int(Control.IRQ_ENABLE | Control.START))
    _settle(tr, 0)
    recs.append(_record(tr, None, t0, []))
    return recs


def all_scenarios(tr) -> dict:
    """Every scenario on one device, in a fixed order (one simulation for the RTL)."""
    return {
        "racing_8": racing_appends(tr, [1, 2, 3], 8, seed=5),
        "racing_4": racing_appends(tr, [4, 5], 4, seed=6),
        "empty_wait": empty_ring_wait(tr, [7, 8]),
        "pause_every_point": pause_every_point(tr, [21, 22]),
        "counters_at_waiting": counters_at_waiting(tr),
        "errors": ring_errors(tr),
    }

"""The golden model's timing of a DRAM narrower than the bus (the ULX3S's 16-bit SDRAM,
sim/golden/narrow_dram.py): the load and store units share it burst by burst, and the fetcher
refills its buffer two instructions a burst."""

import pytest

from npu.config import get_config
from npu.isa import make
from npu.sim.golden.runner import timing_run
from npu.timing import FETCH_BURST, FETCH_REFILL

CFG = get_config("ulx3s")
W = CFG.bus_bytes
CYCLES_PER_WORD = W // CFG.dram_word_bytes


def _events(instrs):
    m = timing_run(CFG, instrs + [make("end")], trace=True)
    return {e.pc: e for e in m.trace if e.unit in ("load", "store")}


def _load(rows):  # `rows` bursts of 64 bytes, apart in DRAM
    return make("load", spad=0, dram=0x1000, rows=rows, cols=64, spad_stride=64, dram_stride=128)


def _store(rows):  # `rows` bursts of 16 bytes
    return make("store", spad=0x4000, dram=0x9000, rows=rows, cols=16, spad_stride=16, dram_stride=64)


def test_a_store_beside_a_long_load_takes_turns_with_its_bursts():
    alone = _events([_load(64)])[0]
    both = _events([_load(64), _store(4)])
    load, store = both[0], both[1]
    store_alone = _events([_store(4)])[0]
    store_cycles = store_alone.end - store_alone.start
    # the store's four bursts go between the load's, not after its 64
    assert store.end < load.end - 32 * (64 // W * CYCLES_PER_WORD), (load, store)
    # the load ends later by about the store's bursts (their words and per-burst cost)
    moved = load.end - alone.end
    assert 4 * (16 // W * CYCLES_PER_WORD) <= moved <= store_cycles, (moved, store_cycles)


def test_a_load_asked_for_during_a_store_moves_the_store_end():
    both = _events([_store(32), _load(2)])
    store_alone = _events([_store(32)])[0]
    assert both[0].end > store_alone.end  # the load's bursts took turns inside the store
    assert both[1].end < both[0].end  # and the short load did not wait for all 32 of its bursts


@pytest.mark.parametrize("n", [64, 128])
def test_the_fetcher_refills_two_instructions_a_burst(n):
    """A run of cheap instructions is held by the fetch: after the buffer's first two bursts, each
    further pair of instructions costs a burst of two (their words and the burst's cost)."""
    sync = make("sync")

    def cycles(k):
        return timing_run(CFG, [sync] * k + [make("end")]).counter_values()["CYCLES"]

    per_pair = 2 * (32 // CFG.dram_word_bytes) + CFG.dram_burst_cycles
    assert FETCH_REFILL == 2 and FETCH_BURST == 4
    assert cycles(2 * n) - cycles(n) == pytest.approx(n // 2 * per_pair, abs=per_pair)


def test_a_program_longer_than_the_dram_is_timed_not_refused_by_the_timing_run():
    """The compiler times a program before it places it in DRAM and refuses one that does not fit
    with the sizes it needs (DramTooSmall): the timing run itself takes it as if the DRAM held it
    (it used to stop with DRAM_RANGE at the first instruction past the DRAM's end)."""
    cfg = get_config("tiny")  # 64 KiB: 2,048 instructions
    n = cfg.dram_bytes // 32 + 100
    prog = [make("sync") for _ in range(n - 1)] + [make("end")]
    m = timing_run(cfg, prog)
    assert m.counter_values()["CYCLES"] >= n

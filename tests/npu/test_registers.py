from npu.registers import COUNTERS, REGISTERS, WINDOW_BYTES


def test_register_map_is_well_formed():
    offsets = []
    for r in REGISTERS:
        assert r.offset % 4 == 0
        offsets.append(r.offset)
        if r.wide:
            assert r.offset % 8 == 0
            offsets.append(r.offset + 4)
    assert len(offsets) == len(set(offsets)), "overlapping registers"
    assert max(offsets) < WINDOW_BYTES
    for name in (
        "CYCLES",
        "BUSY_LOAD",
        "BUSY_MATRIX",
        "BUSY_VECTOR",
        "BUSY_STORE",
        "STALL_DISPATCH",
        "DMA_RD_BYTES",
        "DMA_WR_BYTES",
    ):
        assert name in COUNTERS
